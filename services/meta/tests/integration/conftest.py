"""One real cluster for the meta tests of this session: mgmtd, three storage services (chains of 3), and
a meta service on SQLite; users ``alice`` and ``bob`` and an admin, each with a token.

Shared (session scope) because a cluster takes seconds to start; every test works in its own directory.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

import hf3fs
from ff_testing.cluster import Cluster, running_cluster

LEASE_S = 3.0
WRITABLE_CAPABILITY_TTL_S = 2.0  # short, so that GC (twice that after a removed file's last session) is prompt


# The cluster of these tests (ff_testing.cluster.Cluster): its meta services are ``meta``, alice's client
# ``connect("alice")``, the end of every process's log ``logs()``.
MetaCluster = Cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetaCluster]:
    meta = {
        "session_lease_s": LEASE_S,
        "background_interval_s": 0.3,
        "default_chunk_size": 1 << 20,
        "writable_capability_ttl_s": WRITABLE_CAPABILITY_TTL_S,
    }
    with running_cluster(tmp_path_factory.mktemp("metacluster"), meta=meta) as c:
        yield c


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
