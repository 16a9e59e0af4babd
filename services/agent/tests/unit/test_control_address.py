"""Where hang detection asks a run's collective progress: the master host, whatever the ranks write."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ff_agent.app import control_address


def _run(tmp_path: Path, written: Any) -> Any:
    path = tmp_path / "control.json"
    if written is not None:
        path.write_text(written if isinstance(written, str) else json.dumps(written))
    return SimpleNamespace(collective_file=path, order=SimpleNamespace(master_ip="10.0.0.5", master_port=29500))


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        (None, ("10.0.0.5", 29500)),  # no file: the master port
        ({"addr": "127.0.0.1", "port": 41000}, ("10.0.0.5", 41000)),
        ({"addr": "203.0.113.9", "port": 41000}, ("10.0.0.5", 41000)),  # a rank may not point the agent elsewhere
        ({"addr": "10.0.0.5", "port": 0}, ("10.0.0.5", 29500)),
        ({"addr": "10.0.0.5", "port": 70000}, ("10.0.0.5", 29500)),
        ({"addr": "10.0.0.5", "port": "41000"}, ("10.0.0.5", 29500)),
        ({"addr": "10.0.0.5", "port": True}, ("10.0.0.5", 29500)),
        ("not json", ("10.0.0.5", 29500)),
    ],
)
def test_only_the_port_comes_from_the_ranks_file(tmp_path: Path, written: Any, expected: tuple[str, int]) -> None:
    assert control_address(_run(tmp_path, written)) == expected
