"""The fork server runs scripts as ``python script`` would: environment, argv, path, stdio, exit status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ff_testing.forkserver import ForkServer

SCRIPT = """
import json, os, sys
import helper_beside_the_script
sys.stdout.write("out:" + os.environ["GREETING"] + "\\n")
sys.stderr.write("err:" + " ".join(sys.argv[1:]) + "\\n")
with open(sys.argv[1], "w") as f:
    json.dump({"cwd": os.getcwd(), "preloaded": "json" in sys.modules, "helper": helper_beside_the_script.X}, f)
code = int(os.environ.get("EXIT", "0"))
if code == 99:
    raise RuntimeError("boom")
if os.environ.get("HANG"):
    import time
    time.sleep(60)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    with ForkServer(["json"]) as s:
        yield s


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "helper_beside_the_script.py").write_text("X = 7\n")
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def test_a_child_runs_the_script_with_its_env_argv_cwd_and_stdio(
    server: ForkServer, script: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    proc = server.start(
        [sys.executable, str(script), str(report), "b"], env={**os.environ, "GREETING": "hi"}, cwd=str(tmp_path)
    )
    assert proc.wait(timeout=30) == 0
    assert report.read_text() == f'{{"cwd": "{tmp_path}", "preloaded": true, "helper": 7}}'
    out, err = capfd.readouterr()
    assert "out:hi" in out and f"err:{report} b" in err  # this test's stdout and stderr, not the server's


def test_exit_codes_exceptions_and_signals_come_back_as_popen_gives_them(
    server: ForkServer, script: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "GREETING": "x"}
    procs = [
        server.start([sys.executable, str(script), str(tmp_path / f"r{code}")], env={**env, "EXIT": str(code)})
        for code in (3, 99)
    ]
    assert [p.wait(timeout=30) for p in procs] == [3, 1]
    hung = server.start([sys.executable, str(script), str(tmp_path / "h")], env={**env, "HANG": "1"})
    with pytest.raises(subprocess.TimeoutExpired):
        hung.wait(timeout=0.5)
    assert hung.poll() is None
    hung.kill()
    assert hung.wait(timeout=30) == -signal.SIGKILL


def test_closing_the_server_kills_its_children(script: Path, tmp_path: Path) -> None:
    with ForkServer([]) as s:
        hung = s.start(
            [sys.executable, str(script), str(tmp_path / "h")], env={**os.environ, "GREETING": "x", "HANG": "1"}
        )
        deadline = time.monotonic() + 30
        while not (tmp_path / "h").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{hung.pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{hung.pid}").exists()


def test_a_module_runs_as_python_dash_m_with_modules_preloaded_later(server: ForkServer, tmp_path: Path) -> None:
    package = tmp_path / "pkg_for_dash_m"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import json, sys\n"
        "if __name__ == '__main__':\n"
        "    with open(sys.argv[1], 'w') as f:\n"
        "        json.dump({'argv0': sys.argv[0], 'csv': 'csv' in sys.modules, 'path0': sys.path[0]}, f)\n"
        "    sys.exit(5)\n"
    )
    server.preload(["csv"])  # imported by the server now: in every child forked from here on
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = server.start([sys.executable, "-m", "pkg_for_dash_m", str(report)], env=env, cwd=str(tmp_path))
    assert proc.wait(timeout=30) == 5
    assert json.loads(report.read_text()) == {
        "argv0": str(package / "__main__.py"), "csv": True, "path0": str(tmp_path),
    }  # fmt: skip
    with pytest.raises(RuntimeError, match="preloading no_such_module_here"):
        server.preload(["no_such_module_here"])
    assert server.start([sys.executable, "-m", "pkg_for_dash_m", str(report)], env=env, cwd=str(tmp_path)).wait(30) == 5


def test_a_child_holds_only_its_stdio_as_a_fresh_interpreter_would(server: ForkServer, tmp_path: Path) -> None:
    script = tmp_path / "fds.py"
    script.write_text(
        "import os, sys\nfds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
        "open(sys.argv[1], 'w').write(' '.join(map(str, fds)))\n"
    )
    report = tmp_path / "fds.txt"
    assert server.start([sys.executable, str(script), str(report)], env=dict(os.environ)).wait(timeout=30) == 0
    fresh = subprocess.run([sys.executable, str(script), str(tmp_path / "fresh.txt")], check=True)
    assert fresh.returncode == 0
    assert report.read_text() == (tmp_path / "fresh.txt").read_text()  # 0 1 2, and the listing's own fd
