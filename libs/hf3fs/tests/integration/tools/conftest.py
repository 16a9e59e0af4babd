"""One real cluster for the tools' integration tests (fsspec, CLI, FUSE): mgmtd, three storage services and one
meta service as processes, a user with a token and an admin token. Started once per session (~10 s), so the
tools share it; each test works under its own folder."""

from __future__ import annotations

import atexit
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

import hf3fs
from ff_testing.cluster import StorageCluster, running_cluster
from ff_testing.forkserver import ForkedProcess, ForkServer
from ff_testing.meta import MetaProcess
from fireflyer.common.v1 import common_pb2

USER, ADMIN = "tools-user", "tools-admin"


@dataclass
class FsCluster:
    folder: Path
    storage: StorageCluster
    meta: MetaProcess
    token: str
    admin_token: str
    client: Any = field(default=None, repr=False)

    @property
    def mgmtd(self) -> str:
        return self.storage.mgmtd_address

    @property
    def storage_options(self) -> dict[str, str]:
        return {"mgmtd": self.mgmtd, "token": self.token}

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self.meta.stop()


@pytest.fixture(scope="session")
def fs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FsCluster]:
    users = {USER: common_pb2.ROLE_USER, ADMIN: common_pb2.ROLE_ADMIN}
    with running_cluster(tmp_path_factory.mktemp("fs-cluster"), users=users, meta={"background_interval_s": 0.5}) as c:
        cluster = FsCluster(c.folder, c.storage, c.meta[0], c.tokens[USER], c.tokens[ADMIN])
        try:
            cluster.client = hf3fs.connect(mgmtd=cluster.mgmtd, token=cluster.token)
            # the user owns a folder of their own to work in: "/" belongs to root
            with hf3fs.connect(mgmtd=cluster.mgmtd, token=cluster.admin_token) as admin:
                for top in ("/pandas", "/ffs", "/cli", "/fuse", "/bench"):
                    if not admin.exists(top):
                        admin.mkdir(top, mode=0o777)
            yield cluster
        finally:
            cluster.stop()  # (its meta may be another process by now: a test restarts it)


_CLI_FORKS: list[ForkServer] = []


def _cli_forks() -> ForkServer:
    """A fork server with ``hf3fs.cli`` imported, started on first use, stopped at exit."""
    if not _CLI_FORKS or not _CLI_FORKS[0].usable:
        if _CLI_FORKS:
            _CLI_FORKS.pop().close()
        server = ForkServer(["hf3fs.cli"])
        atexit.register(server.close)
        _CLI_FORKS.append(server)
    return _CLI_FORKS[0]


def run_cli(
    args: list[str], *, env: dict[str, str], timeout_s: float, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m hf3fs args...`` as a process of its own, forked from a fork server that imported ``hf3fs.cli``
    once (a fresh interpreter spends ~0.7 s of CPU importing it, 2-3 s on a loaded machine); ``fresh``: a new
    interpreter, as a user starts it. The child runs ``hf3fs.__main__`` afresh (runpy), with its own environment,
    exit status, stdout and stderr."""
    argv = [sys.executable, "-m", "hf3fs", *args]
    if fresh:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        code = _cli_forks().start(argv, env=env, stdout=out, stderr=err).wait(timeout=timeout_s)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, code, out.read(), err.read())


def start_cli(
    args: list[str], *, env: dict[str, str], log: IO[bytes], fresh: bool = False
) -> ForkedProcess | subprocess.Popen[bytes]:
    """``python -m hf3fs args...`` left running (a mount), forked as ``run_cli``'s are; stdout and stderr to ``log``.

    ``fresh``: a new interpreter, for a process whose interpreter start matters (a ``sitecustomize`` on its
    ``PYTHONPATH``: a forked child has started already).
    """
    argv = [sys.executable, "-m", "hf3fs", *args]
    if fresh:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    return _cli_forks().start(argv, env=env, stdout=log, stderr=log)
