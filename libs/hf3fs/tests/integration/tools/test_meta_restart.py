"""A Close while meta is down (issue 17, defect 5): the client retries it until meta is back, or, past its
deadline, raises and closes the session once meta answers; the file never stays at size 0 with an open session.
Meta is a real process, stopped and started again on the same address."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

import hf3fs

from .conftest import FsCluster


def _restart_meta(cluster: FsCluster) -> None:
    """Start meta again where it listened before (the client keeps its address), on the same database."""
    cluster.meta.start_again()
    asyncio.run(cluster.meta.ready())


@pytest.fixture
def cluster(fs_cluster: FsCluster) -> Iterator[FsCluster]:
    """The shared cluster, with meta running again after the test however it ended."""
    try:
        yield fs_cluster
    finally:
        if fs_cluster.meta.proc is not None and fs_cluster.meta.proc.poll() is not None:
            _restart_meta(fs_cluster)


def _write_open(client: hf3fs.FileSystem, path: str, data: bytes) -> object:
    f = client.open(path, "wb", buffering=0)
    f.write(data)
    return f


def test_a_close_during_a_meta_restart_waits_for_meta_and_the_length_is_exact(cluster: FsCluster) -> None:
    fs_cluster = cluster
    client = hf3fs.connect(mgmtd=fs_cluster.mgmtd, token=fs_cluster.token, close_retry_s=120)
    try:
        client.makedirs("/ffs/restart", exist_ok=True)
        f = _write_open(client, "/ffs/restart/during", b"z" * 5000)
        other = _write_open(client, "/ffs/restart/other", b"o")  # keeps the client renewing sessions
        fs_cluster.meta.stop()
        errors: list[BaseException] = []

        def close() -> None:
            try:
                f.close()  # type: ignore[attr-defined]
            except BaseException as err:
                errors.append(err)

        closer = threading.Thread(target=close)
        closer.start()
        time.sleep(1.0)  # meta stays away a while (the point of the test): the close must keep retrying
        assert closer.is_alive()  # retrying, not failed
        _restart_meta(fs_cluster)
        closer.join(timeout=120)
        assert not closer.is_alive() and errors == []
        st = client.stat("/ffs/restart/during")
        assert (st.size, st.write_sessions) == (5000, 0)
        other.close()  # type: ignore[attr-defined]
    finally:
        client.close()


def test_a_close_past_its_deadline_raises_and_is_closed_when_meta_answers(cluster: FsCluster) -> None:
    client = hf3fs.connect(mgmtd=cluster.mgmtd, token=cluster.token, close_retry_s=1.0)
    try:
        client.makedirs("/ffs/restart", exist_ok=True)
        f = _write_open(client, "/ffs/restart/late", b"q" * 7000)
        other = _write_open(client, "/ffs/restart/late-other", b"o")  # renewals would keep a lost session alive
        cluster.meta.stop()
        with pytest.raises(hf3fs.Hf3fsError, match="close did not reach meta"):
            f.close()  # type: ignore[attr-defined]
        assert client.unclosed_sessions() == ["/ffs/restart/late"]
        _restart_meta(cluster)
        deadline = time.monotonic() + 60
        while client.unclosed_sessions() and time.monotonic() < deadline:
            time.sleep(0.2)  # the renewer closes it within a tick of meta answering
        assert client.unclosed_sessions() == []
        st = client.stat("/ffs/restart/late")
        assert (st.size, st.write_sessions) == (7000, 0)
        other.close()  # type: ignore[attr-defined]
    finally:
        client.close()
