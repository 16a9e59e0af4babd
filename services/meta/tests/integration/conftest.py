"""One real cluster for the meta tests of this session: mgmtd, three storage services (chains of 3), and
a meta service on SQLite; users ``alice`` and ``bob`` and an admin, each with a token.

Shared (session scope) because a cluster takes seconds to start; every test works in its own directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import hf3fs
from ff_cluster import MgmtdClient
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster, start_cluster, tail_logs
from ff_testing.meta import MetaProcess, meta_process
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

LEASE_S = 3.0


@dataclass
class MetaCluster:
    storage: StorageCluster
    meta: list[MetaProcess]
    tokens: dict[str, str]
    uids: dict[str, int]

    @property
    def mgmtd(self) -> str:
        return self.storage.mgmtd_address

    def connect(self, user: str = "alice", **kwargs: object) -> hf3fs.FileSystem:
        return hf3fs.connect(self.mgmtd, self.tokens[user], **kwargs)  # type: ignore[arg-type]

    def logs(self) -> str:
        return tail_logs(self.storage.folder)


async def make_users(address: str) -> tuple[dict[str, str], dict[str, int]]:
    client = MgmtdClient([address], token=CLUSTER_TOKEN)
    tokens, uids = {}, {}
    try:
        for name, role in (("alice", common_pb2.ROLE_USER), ("bob", common_pb2.ROLE_USER),
                           ("root", common_pb2.ROLE_ADMIN)):  # fmt: skip
            user = await client.identity.create_user(mpb.CreateUserRequest(name=name, role=role))
            uids[name] = user.user.uid
            issued = await client.identity.issue_token(mpb.IssueTokenRequest(user_name=name))
            tokens[name] = issued.token
    finally:
        await client.close()
    return tokens, uids


async def _start(folder: Path) -> MetaCluster:
    storage = await start_cluster(folder)
    try:
        tokens, uids = await make_users(storage.mgmtd_address)
        meta = meta_process(folder, "meta1", mgmtd_address=storage.mgmtd_address, cluster_token=CLUSTER_TOKEN,
                            database_url=f"sqlite:///{folder / 'meta.db'}", session_lease_s=LEASE_S,
                            background_interval_s=0.3, default_chunk_size=1 << 20)  # fmt: skip
        meta.start()
        await meta.ready()
        return MetaCluster(storage, [meta], tokens, uids)
    except BaseException:
        storage.stop()
        raise


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetaCluster]:
    c = asyncio.run(_start(tmp_path_factory.mktemp("metacluster")))
    try:
        yield c
    finally:
        for m in c.meta:
            m.stop()
        c.storage.stop()


@pytest.fixture(scope="session")
def admin_fs(cluster: MetaCluster) -> Iterator[hf3fs.FileSystem]:
    with cluster.connect("root") as fs:
        yield fs


@pytest.fixture
def fs(cluster: MetaCluster) -> Iterator[hf3fs.FileSystem]:
    with cluster.connect("alice") as f:
        yield f


@pytest.fixture
def home(fs: hf3fs.FileSystem) -> Iterator[str]:
    """A fresh directory of alice's for one test."""
    path = f"/t-{uuid.uuid4().hex[:8]}"
    fs.mkdir(path)
    yield path
    with contextlib.suppress(OSError):
        fs.rmtree(path, trash=False)
