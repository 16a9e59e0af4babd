"""``run_service`` in a real process: the service runs, stops, and leaves little for the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

# A service whose main keeps many objects alive in a module global (as grpc, protobuf and sqlalchemy do), and a
# probe that reports, from the exit handlers, how many objects the teardown's collection will have to skip.
SERVICE = """
import atexit, gc, sys
from ff_config import SettingsModel
from ff_rpc.entry import run_service

class Settings(SettingsModel):
    log_level: str = "WARNING"

KEPT = []

async def main(settings):
    KEPT.extend([i] for i in range(100_000))

atexit.register(lambda: print("frozen", gc.get_freeze_count(), flush=True))
sys.exit(run_service(service="probe", description="probe", model=Settings, env_prefix="FF_PROBE_", main=main,
                     argv=[]))
"""


def test_a_stopped_service_freezes_its_objects_before_the_teardown() -> None:
    # The teardown's collection of a service's objects took 1-3 s per process on a loaded machine, after the
    # service had stopped; frozen objects are skipped by it, and the exit handlers still run.
    done = subprocess.run([sys.executable, "-c", SERVICE], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    frozen = int(done.stdout.split("frozen ")[1].split()[0])
    assert frozen >= 100_000, done.stdout
