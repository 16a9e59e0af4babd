"""Service processes: one that dies before it is ready shows its log; a spawned one runs as ``python -m`` would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ff_testing.process import ServiceProcess, spawn


async def test_a_process_that_exits_before_ready_shows_its_log(tmp_path: Path) -> None:
    script = "import sys; print('ImportError: no module named ff_broken', flush=True); sys.exit(3)"
    service = ServiceProcess("m1", tmp_path, [sys.executable, "-c", script], env={})
    service.start()
    with pytest.raises(RuntimeError) as failure:
        await service.ready(timeout_s=20)
    assert "exited with 3 before it was ready" in str(failure.value)
    assert "the end of m1.log" in str(failure.value) and "no module named ff_broken" in str(failure.value)


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "fresh-interpreter"])
def test_a_spawned_module_has_its_env_log_and_exit_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork: str
) -> None:
    monkeypatch.setenv("FF_TEST_FORK_SERVICES", fork)
    package = tmp_path / "svc_for_spawn"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import os, sys\nprint('hello', os.environ['WHO'], sys.argv[1:])\nsys.exit(int(os.environ['CODE']))\n"
    )
    log_path = tmp_path / "svc.log"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "WHO": "svc", "CODE": "4", "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as log:
        proc = spawn([sys.executable, "-m", "svc_for_spawn", "--flag", "x"], log=log, env=env)
    assert proc.wait(timeout=30) == 4
    assert log_path.read_text() == "hello svc ['--flag', 'x']\n"
    assert isinstance(proc, subprocess.Popen) == (fork == "0")
