"""Finding the PostgreSQL binaries, or failing clearly when they are missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ff_testing import PostgresServerError, postgres


def test_missing_binaries_fail_with_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(postgres, "SEARCH_DIRS_GLOB", str(tmp_path / "postgresql" / "*" / "bin"))

    with pytest.raises(PostgresServerError, match="apt-get install postgresql"):
        postgres.find_bin_dir()


def test_newest_versioned_folder_wins_when_not_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for version in ("9", "15", "16"):
        bin_dir = tmp_path / "postgresql" / version / "bin"
        bin_dir.mkdir(parents=True)
        for tool in ("initdb", "pg_ctl", "postgres") if version != "16" else ("pg_ctl",):
            (bin_dir / tool).touch()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(postgres, "SEARCH_DIRS_GLOB", str(tmp_path / "postgresql" / "*" / "bin"))

    # 16 lacks initdb and postgres (a client-only install), so 15 is the newest server.
    assert postgres.find_bin_dir() == tmp_path / "postgresql" / "15" / "bin"
