"""The console commands freeze their objects before the interpreter's teardown: collecting the grpc and protobuf
objects each imported cost 0.2-0.4 s of every call on a loaded 2-core machine (the e2e tests make hundreds of
calls), and frozen objects are skipped by that collection. What each command answers is unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ff_testing.environ import clean_env

pytestmark = pytest.mark.integration

# Runs a console entry point as its script does, and reports from the exit handlers how many objects the
# interpreter's teardown will skip.
PROBE = """
import atexit, gc, importlib, sys
module, argv = sys.argv[1], sys.argv[2:]
main = importlib.import_module(module).main
atexit.register(lambda: print("frozen", gc.get_freeze_count(), flush=True))
sys.argv = argv
sys.exit(main())
"""


@pytest.mark.parametrize(
    ("module", "argv", "code", "error"),
    [
        ("ff_appliance.cli", ["fireflyer", "whoami", "--state-dir", "{tmp}/none"], 1, "fireflyer: no cluster in"),
        ("hf3fs.cli", ["hf3fs", "ls", "/"], 2, "hf3fs: no cluster: pass --mgmtd"),
        ("hfai.cli", ["hfai", "list"], 2, "hfai: no cluster address or token"),
    ],
    ids=["fireflyer", "hf3fs", "hfai"],
)
def test_the_command_freezes_its_objects_before_the_teardown(
    tmp_path: Path, module: str, argv: list[str], code: int, error: str
) -> None:
    args = [a.format(tmp=tmp_path) for a in argv]
    # No cluster configured: HOME is an empty folder (hfai keeps its configuration there).
    env = clean_env({"HOME": str(tmp_path)})
    done = subprocess.run([sys.executable, "-c", PROBE, module, *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == code and done.stderr.startswith(error), (done.returncode, done.stderr)
    assert int(done.stdout.split("frozen ")[1].split()[0]) > 10_000, done.stdout
