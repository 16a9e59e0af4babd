"""The fireflyer CLI as a real process: bad ids refused as usage errors, the cluster's client variables
honoured, a closed output pipe ended quietly."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ff_testing.environ import clean_env
from ff_testing.mgmtd import CLUSTER_TOKEN, start_in_process


def fireflyer(
    *args: str, env: dict[str, str] | None = None, stdout: int = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ff_appliance", *args],
        env=clean_env(env),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("uid", "says"),
    [
        ("-7", "-7 is not a positive number"),
        ("0", "0 is root's"),
        ("4294967295", "is above 4294967294"),
        ("x", "'x' is not a number"),
    ],
)
def test_bad_uid_is_a_usage_error_before_any_call(tmp_path: Path, uid: str, says: str) -> None:
    done = fireflyer("user", "add", "carol", "--uid", uid, "--state-dir", str(tmp_path), "--mgmtd", "127.0.0.1:1")
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


async def test_whoami_finds_mgmtd_through_ff_mgmtd_addresses(tmp_path: Path, sqlite_url: str) -> None:
    mgmtd = await start_in_process(tmp_path, sqlite_url)
    try:
        env = {"FF_MGMTD_ADDRESSES": mgmtd.address, "FF_TOKEN": CLUSTER_TOKEN}
        where = str(tmp_path / "no-cluster-here")
        done = await asyncio.to_thread(lambda: fireflyer("whoami", "--state-dir", where, env=env))
        assert (done.returncode, done.stdout) == (0, "cluster (the service-to-service token)\n"), done.stderr
    finally:
        await mgmtd.shutdown()


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader went away, as `fireflyer ... | head -1` leaves it
    try:
        done = fireflyer("down", "--state-dir", str(tmp_path), stdout=write_end)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == "", done.stderr
