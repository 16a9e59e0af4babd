"""Write sessions of a killed client, directory quotas, chunk GC of removed files, the trash."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import hf3fs
from ff_cluster import MgmtdClient
from ff_testing.cluster import CLUSTER_TOKEN
from fireflyer.storage.v1 import storage_pb2 as spb
from hf3fs.spans import read_spans, write_spans
from hf3fs.storage_client import ChunkWrite

from .conftest import LEASE_S, WRITABLE_CAPABILITY_TTL_S, MetaCluster

MiB = 1 << 20


def _wait(pred: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _chunks_on_storage(cluster: MetaCluster, inode_id: int, chains: list[int], n: int) -> int:
    """How many of chunks 0..n-1 of the inode storage still holds (read with the cluster token)."""

    async def count() -> int:
        mg = MgmtdClient([cluster.mgmtd], token=CLUSTER_TOKEN)
        sc = hf3fs.StorageClient(mg, CLUSTER_TOKEN)
        try:
            ios = [hf3fs.ChunkRead(chain_id=chains[i % len(chains)], inode_id=inode_id, chunk_index=i, length=1)
                   for i in range(n)]  # fmt: skip
            out = await sc.batch_read(ios)
            return sum(1 for o in out if o.status != spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND)
        finally:
            await sc.close()
            await mg.close()

    return asyncio.run(count())


WRITER = textwrap.dedent("""
    import sys, time, hf3fs
    fs = hf3fs.connect(sys.argv[1], sys.argv[2])
    f = fs.open(sys.argv[3], "wb", buffering=0)
    f.write(b"k" * int(sys.argv[4]))
    print("written", flush=True)
    time.sleep(3600)
""")


def test_killed_writer_session_collected_length_exact_then_gc(cluster: MetaCluster, fs: hf3fs.FileSystem,
                                                              home: str) -> None:  # fmt: skip
    path = f"{home}/killed.bin"
    size = 3 * MiB + 100
    args = [sys.executable, "-c", WRITER, cluster.mgmtd, cluster.tokens["alice"], path, str(size)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == b"written"
            assert fs.stat(path).write_sessions == 1  # the writer's, open
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    # The writer never closed: meta collects its session when the lease lapses, with the length from storage.
    _wait(lambda: fs.stat(path).size == size, LEASE_S * 4 + 10, "the dead writer's session to be collected")
    st = fs.stat(path)
    assert st.write_sessions == 0
    with fs.open(path, "rb") as f:
        assert f.read() == b"k" * size
    with fs.open(path, "rb", buffering=0) as raw:  # the file's layout, as the client computed it at open
        chains = list(raw.layout.chains)
    n = (size + st.chunk_size - 1) // st.chunk_size
    assert _chunks_on_storage(cluster, st.inode_id, chains, n) == n
    # No session is left: removing the file frees its chunks at once (GC), which waits for sessions.
    fs.remove(path)
    _wait(lambda: _chunks_on_storage(cluster, st.inode_id, chains, n) == 0, 30, "GC to remove the chunks")


def test_a_writable_capability_kept_after_close_writes_nothing_once_the_file_is_collected(
    cluster: MetaCluster, fs: hf3fs.FileSystem, home: str
) -> None:
    """A client that kept a removed file's writable capability could write chunks after GC removed the file's: on
    no file, in no quota, removed by nothing (before: the capability lived 24 hours, and storage took 1 MiB)."""
    f = fs.open(f"{home}/victim", "wb", buffering=0)
    f.write(b"x" * 100)
    cap, layout, inode_id, expires_ns = f._cap, f.layout, f.inode_id, f.cap_expires_at_ns
    assert expires_ns - time.time_ns() <= WRITABLE_CAPABILITY_TTL_S * 1e9
    f.close()
    chains = list(layout.chains)
    fs.remove(f"{home}/victim")
    _wait(lambda: _chunks_on_storage(cluster, inode_id, chains, 1) == 0, 30, "GC to remove the chunk")
    ghost = memoryview(b"y" * MiB)
    with pytest.raises(OSError):  # the capability expired before GC removed the chunks
        fs._conn.run(write_spans(fs._conn.storage, layout, cap, 0, ghost, "ghost"))
    assert _chunks_on_storage(cluster, inode_id, chains, 1) == 0


def test_a_writable_capability_writes_only_where_the_file_s_layout_puts_each_chunk(
    cluster: MetaCluster, fs: hf3fs.FileSystem, home: str
) -> None:
    """A chunk stored on a chain the layout does not put it on, or of another chunk size, is found by neither the
    file's length nor its removal: space outside any quota, forever (before: storage took both)."""
    f = fs.open(f"{home}/own", "wb", buffering=0)
    f.write(b"x" * 100)
    layout, cap, inode_id = f.layout, f._cap, f.inode_id
    assert len(layout.chains) >= 2, "the test cluster's chain table has one chain"
    wrong = [
        ChunkWrite(chain_id=layout.chains[1], inode_id=inode_id, chunk_index=0, data=b"y" * MiB,
                   chunk_size=layout.chunk_size, capability=cap),
        ChunkWrite(chain_id=layout.chains[0], inode_id=inode_id, chunk_index=0, data=b"y" * MiB,
                   chunk_size=layout.chunk_size * 4, capability=cap),
    ]  # fmt: skip
    for io in wrong:
        with pytest.raises(hf3fs.StorageIoError) as refused:
            fs._conn.run(fs._conn.storage.batch_write([io]))
        assert refused.value.code.name == "PERMISSION_DENIED"
    f.write(b"z" * 100)  # the file's own writes go on
    f.close()
    with fs.open(f"{home}/own", "rb") as r:
        assert r.read() == b"x" * 100 + b"z" * 100
    assert _chunks_on_storage(cluster, inode_id, [layout.chains[1]], 1) == 0


def test_a_writable_capability_writes_only_what_the_quota_reserved(
    cluster: MetaCluster, admin_fs: hf3fs.FileSystem, fs: hf3fs.FileSystem, home: str
) -> None:
    """A client that writes to storage itself, past the quota its session reserved (before: storage took it, and
    the quota learned of it only when the length came back, if ever)."""
    admin_fs.set_quota(home, max_bytes=2 * MiB)
    f = fs.open(f"{home}/capped", "wb", buffering=0)
    f.write(b"x" * 100)  # reserves what the quota grants: 2 MiB
    layout, inode_id = f.layout, f.inode_id
    assert f._limit <= 2 * MiB
    past = f._limit // layout.chunk_size  # the chunk holding the limit, written up to its end
    io = ChunkWrite(chain_id=layout.chain_of(past), inode_id=inode_id, chunk_index=past, data=b"y" * layout.chunk_size,
                    chunk_size=layout.chunk_size, capability=f._cap)  # fmt: skip
    with pytest.raises(hf3fs.StorageIoError) as refused:
        fs._conn.run(fs._conn.storage.batch_write([io]))
    assert refused.value.code.name == "PERMISSION_DENIED"
    assert "limit" in str(refused.value)
    f.close()
    assert fs.stat(f"{home}/capped").size == 100


def test_a_writer_keeps_writing_past_its_capability_s_lifetime(fs: hf3fs.FileSystem, home: str) -> None:
    """A handle open for longer than a writable capability lives opens the file again for a new one, in time."""
    with fs.open(f"{home}/long", "wb", buffering=0) as f:
        for k in range(4):
            f.write(bytes([65 + k]) * 1000)
            time.sleep(WRITABLE_CAPABILITY_TTL_S * 0.7)
    with fs.open(f"{home}/long", "rb") as r:
        assert r.read() == b"A" * 1000 + b"B" * 1000 + b"C" * 1000 + b"D" * 1000
    buf = bytearray(4)
    with fs.open(f"{home}/long", "rb", buffering=0) as r:  # read-only capabilities live long: read by it later
        fs._conn.run(read_spans(fs._conn.storage, r.layout, r._cap, 0, 4, "long", memoryview(buf)))
    assert bytes(buf) == b"AAAA"


def test_a_writer_keeps_writing_past_its_capability_s_lifetime_once_its_file_is_read_only(
    fs: hf3fs.FileSystem, home: str
) -> None:
    """An open descriptor keeps its access when the file's mode changes (POSIX: git's 0444 pack files are written so).

    Its capability refresh names its write session, which is the permission (before: the refresh was an ordinary
    write open, EACCES once the file was 0444, and the writes after a capability's lifetime failed).
    """
    with fs.open(f"{home}/ro", "wb", buffering=0) as f:
        f.write(b"A" * 1000)
        fs.chmod(f"{home}/ro", 0o444)
        for k in range(1, 3):
            time.sleep(WRITABLE_CAPABILITY_TTL_S * 0.9)
            f.write(bytes([65 + k]) * 1000)
    with fs.open(f"{home}/ro", "rb") as r:
        assert r.read() == b"A" * 1000 + b"B" * 1000 + b"C" * 1000
    with pytest.raises(PermissionError):  # a new write open is still refused
        fs.open(f"{home}/ro", "ab")


def test_buffered_extents_flush_under_a_session_reopened_at_the_file_s_length(
    cluster: MetaCluster, admin_fs: hf3fs.FileSystem, fs: hf3fs.FileSystem, home: str
) -> None:
    """The mount buffers extents with their quota reserved (``ensure_room``) and flushes them later; a session meta
    collected meanwhile is opened again with its limit at the file's length. The flush reserves again (before: its
    capability named the new, lower limit and storage refused the buffered bytes: EIO, data lost)."""
    from fireflyer.meta.v1 import meta_pb2 as mpb

    admin_fs.set_quota(home, max_bytes=8 * MiB)
    raw = fs.open(f"{home}/buffered", "wb", buffering=0)
    raw.write(b"a" * 100)
    raw.ensure_room(2 * MiB)  # as the mount does when it buffers a write
    session = raw.session
    assert session is not None
    # The session's lease lapses and meta collects it (here: ended behind the client's back), then the client's
    # renewal opens it again: its limit is the file's length.
    fs._conn.run(fs._conn.meta.call(lambda m: m.close, mpb.CloseRequest(inode_id=raw.inode_id,
                                                                         session_id=session.session_id)))  # fmt: skip
    fs._conn.run(fs._sessions._reopen(raw))
    assert raw._limit < 2 * MiB and not raw.lost
    data = memoryview(b"b" * (2 * MiB - 100))
    raw.write_extents([(100, data)])
    raw.close()
    with fs.open(f"{home}/buffered", "rb") as r:
        assert r.read() == b"a" * 100 + b"b" * (2 * MiB - 100)
    quota = fs.get_quota(home)
    assert quota is not None and quota.used_bytes == 2 * MiB


class _SkewedTime:
    """``time`` as ``hf3fs.files`` sees it, with a wall clock ``skew_ns`` off this machine's."""

    def __init__(self, skew_ns: int) -> None:
        self.skew_ns = skew_ns

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def time_ns(self) -> int:
        return time.time_ns() + self.skew_ns


def test_a_writer_whose_clock_is_behind_meta_s_keeps_writing(
    monkeypatch: pytest.MonkeyPatch, fs: hf3fs.FileSystem, home: str
) -> None:
    """A client clock behind meta's (or storage's ahead) by more than the refresh margin, a quarter of a writable
    capability's lifetime: the client wrote with a capability storage says expired. Refused, it takes a new one and
    writes again (before: PermissionError until its clock reached its refresh time, every lifetime)."""
    monkeypatch.setattr(hf3fs.files, "time", _SkewedTime(-int(WRITABLE_CAPABILITY_TTL_S * 2e9)))
    with fs.open(f"{home}/behind", "wb", buffering=0) as f:
        f.write(b"A" * 1000)
        time.sleep(WRITABLE_CAPABILITY_TTL_S * 1.2)
        f.write(b"B" * 1000)
    with fs.open(f"{home}/behind", "rb") as r:
        assert r.read() == b"A" * 1000 + b"B" * 1000


def test_a_writer_whose_clock_is_ahead_of_meta_s_by_more_than_a_lifetime_does_not_refresh_at_every_write(
    monkeypatch: pytest.MonkeyPatch, fs: hf3fs.FileSystem, home: str
) -> None:
    """Every capability meta gives looks expired to a client clock ahead by more than its lifetime: the client opened
    the file again before each write (before: 20 Opens for 20 writes). It refreshes when storage refuses one."""
    from fireflyer.meta.v1 import meta_pb2 as mpb

    monkeypatch.setattr(hf3fs.files, "time", _SkewedTime(int(WRITABLE_CAPABILITY_TTL_S * 3e9)))
    with fs.open(f"{home}/ahead", "wb", buffering=0) as f:
        backend = f._fs
        answer = backend.meta_call
        opens = []

        def counted(method: object, request: object, path: str | None = None) -> object:
            if isinstance(request, mpb.OpenRequest):
                opens.append(request)
            return answer(method, request, path)  # type: ignore[arg-type]

        monkeypatch.setattr(backend, "meta_call", counted)
        for k in range(20):
            f.write(bytes([65 + k]) * 100)
        assert len(opens) <= 1
        time.sleep(WRITABLE_CAPABILITY_TTL_S * 1.2)  # expired by storage's clock: refused, refreshed, sent again
        f.write(b"Z" * 100)
    with fs.open(f"{home}/ahead", "rb") as r:
        assert r.read() == b"".join(bytes([65 + k]) * 100 for k in range(20)) + b"Z" * 100


def test_a_writer_keeps_writing_while_its_capability_refresh_finds_no_meta(
    monkeypatch: pytest.MonkeyPatch, fs: hf3fs.FileSystem, home: str
) -> None:
    """A refresh is due a quarter of a lifetime before the capability expires; meta not answering it then (a restart)
    leaves the writer with the one it holds until then (before: the write failed with the refresh's error)."""
    from fireflyer.meta.v1 import meta_pb2 as mpb

    f = fs.open(f"{home}/no-meta", "wb", buffering=0)
    f.write(b"A" * 1000)
    backend = f._fs
    answer = backend.meta_call

    def no_meta_for_open(method: object, request: object, path: str | None = None) -> object:
        if isinstance(request, mpb.OpenRequest):
            raise hf3fs.Hf3fsError("no meta service answered")
        return answer(method, request, path)  # type: ignore[arg-type]

    monkeypatch.setattr(backend, "meta_call", no_meta_for_open)
    # The refresh is due (the client's clock at the margin), the capability still good by storage's.
    monkeypatch.setattr(hf3fs.files, "time", _SkewedTime(f.cap_expires_at_ns - f._cap_margin_ns - time.time_ns()))
    f.write(b"B" * 1000)
    monkeypatch.undo()
    f.close()
    with fs.open(f"{home}/no-meta", "rb") as r:
        assert r.read() == b"A" * 1000 + b"B" * 1000


def test_a_closed_session_s_capability_writes_nothing_outside_the_quota(
    cluster: MetaCluster, admin_fs: hf3fs.FileSystem, fs: hf3fs.FileSystem, home: str
) -> None:
    """Reserve the whole quota, close (the reservation goes back), write up to the capability's limit; again with
    another file: three times the quota on storage, which counts once the capabilities expired (before: none of it,
    ever; meta's lengths stayed 0)."""
    admin_fs.set_quota(home, max_bytes=2 * MiB)
    files = []
    for k in range(3):
        f = fs.open(f"{home}/f{k}", "wb", buffering=0)
        f.ensure_room(2 * MiB)
        cap, layout = f._cap, f.layout
        files.append((f.inode_id, list(layout.chains), layout.chunk_size))
        f.close()
        with contextlib.suppress(OSError):  # refused: what the quota asks
            fs._conn.run(write_spans(fs._conn.storage, layout, cap, 0, memoryview(b"y" * 2 * MiB), "past"))
    stored = sum(_chunks_on_storage(cluster, i, chains, 2) * size for i, chains, size in files)
    assert stored > 0, "nothing written past the closes: the test shows nothing"

    def counted() -> bool:  # once every capability given out has expired, storage is asked the files' lengths
        quota = fs.get_quota(home)
        return quota is not None and quota.used_bytes >= stored

    _wait(counted, WRITABLE_CAPABILITY_TTL_S * 2 + 20, "what the closed sessions' capabilities wrote to count")
    assert sum(fs.stat(f"{home}/f{k}").size for k in range(3)) == stored  # before: 6 MiB stored, 0 counted


def test_a_truncate_under_an_open_writer_leaves_its_limit_reserved(
    admin_fs: hf3fs.FileSystem, fs: hf3fs.FileSystem, home: str
) -> None:
    """A writer's session may write up to its limit (its capability says so) after its file was cut: the quota keeps
    that room reserved, not free for another writer as well (before: both wrote, 3 MiB under a 2 MiB quota)."""
    admin_fs.set_quota(home, max_bytes=2 * MiB)
    a = fs.open(f"{home}/a", "wb", buffering=0)
    a.write(b"a" * (2 * MiB))
    a.fsync()
    a.truncate(0)
    quota = fs.get_quota(home)
    assert quota is not None and quota.used_bytes == 2 * MiB  # (reservations included) before: 0
    with pytest.raises(OSError) as exc, fs.open(f"{home}/b", "wb", buffering=0) as b:
        b.write(b"b" * MiB)
    assert exc.value.errno == errno.EDQUOT
    a.seek(0)
    a.write(b"c" * (2 * MiB))  # within the limit it holds: no reservation asked
    a.close()
    quota = fs.get_quota(home)
    assert quota is not None and quota.used_bytes == 2 * MiB
    fs.remove(f"{home}/a")
    with fs.open(f"{home}/b", "wb") as b:  # the reservation went with the writer's Close
        b.write(b"b" * (2 * MiB))


def test_quota_enforced_and_nothing_written_past_it(admin_fs: hf3fs.FileSystem, fs: hf3fs.FileSystem,
                                                    home: str) -> None:  # fmt: skip
    q = admin_fs.set_quota(home, max_bytes=3 * MiB, max_inodes=5)
    assert q.max_bytes == 3 * MiB and q.used_inodes == 1  # the directory itself
    with fs.open(f"{home}/a.bin", "wb") as f:
        f.write(os.urandom(2 * MiB))
    with pytest.raises(OSError) as exc, fs.open(f"{home}/b.bin", "wb") as f:
        f.write(b"y" * (2 * MiB))
    assert exc.value.errno == errno.EDQUOT
    assert "quota" in str(exc.value)
    assert fs.stat(f"{home}/b.bin").size == 0  # nothing past the limit
    with fs.open(f"{home}/b.bin", "ab") as f:  # what fits still goes in
        f.write(b"z" * MiB)
    quota = fs.get_quota(f"{home}/b.bin")
    assert quota is not None and quota.used_bytes == 3 * MiB and quota.used_inodes == 3
    fs.mkdir(f"{home}/d")
    fs.create(f"{home}/d/e")
    with pytest.raises(OSError) as exc:
        fs.create(f"{home}/d/f")
    assert exc.value.errno == errno.EDQUOT
    assert not fs.exists(f"{home}/d/f")
    # Freed space can be used again; the trash does not count.
    fs.rmtree(f"{home}/d")
    fs.remove(f"{home}/a.bin")
    with fs.open(f"{home}/c.bin", "wb") as f:
        f.write(b"c" * (2 * MiB))
    assert fs.get_quota(home).used_bytes == 3 * MiB  # type: ignore[union-attr]
    assert [x.path for x in admin_fs.list_quotas()].count(home) == 1
    with pytest.raises(PermissionError):
        fs.set_quota(home, max_bytes=1)  # admins only
    admin_fs.set_quota(home)  # removed
    assert fs.get_quota(home) is None


def test_create_answers_the_tightest_byte_quotas_room(admin_fs: hf3fs.FileSystem, fs: hf3fs.FileSystem,
                                                       home: str) -> None:  # fmt: skip
    assert fs.create_file(f"{home}/free")[1] is None  # no quota above it
    admin_fs.set_quota(home, max_bytes=3 * MiB)
    fs.mkdir(f"{home}/in")
    admin_fs.set_quota(f"{home}/in", max_bytes=2 * MiB, max_inodes=10)
    outer, inner = fs.stat(home), fs.stat(f"{home}/in")
    assert fs.create_file(f"{home}/in/x")[1] == (2 * MiB, inner.inode_id)
    with fs.open(f"{home}/a.bin", "wb") as f:
        f.write(b"a" * (MiB + 5))
    # the outer quota is the tightest now, though the folder's own one has more left
    assert fs.create_file(f"{home}/in/y")[1] == (2 * MiB - 5, outer.inode_id)
    admin_fs.set_quota(f"{home}/in", max_inodes=10)  # an inode quota alone limits no bytes
    assert fs.create_file(f"{home}/in/z")[1] == (2 * MiB - 5, outer.inode_id)
    assert fs.create_file(f"{home}/z")[1] == (2 * MiB - 5, outer.inode_id)


def test_trash_restore_and_empty(fs: hf3fs.FileSystem, home: str) -> None:
    fs.makedirs(f"{home}/t/u")
    with fs.open(f"{home}/t/u/f", "wb") as f:
        f.write(b"keep me")
    tid = fs.rmtree(f"{home}/t")
    assert not fs.exists(f"{home}/t")
    entries = {e.entry_id: e for e in fs.trash_list()}
    assert entries[tid].original_path == f"{home}/t" and entries[tid].expires_at_ns > time.time_ns()
    assert fs.trash_restore(tid, f"{home}/back") == f"{home}/back"
    with fs.open(f"{home}/back/u/f") as f:
        assert f.read() == b"keep me"
    tid = fs.rmtree(f"{home}/back")
    assert fs.trash_empty([tid]) == 1
    assert tid not in {e.entry_id for e in fs.trash_list()}
    with pytest.raises(FileNotFoundError):
        fs.trash_restore(tid)


def test_failed_rename_into_a_quota_changes_nothing(admin_fs: hf3fs.FileSystem, fs: hf3fs.FileSystem,
                                                    home: str) -> None:  # fmt: skip
    """The rename replaces its target before it finds the quota exceeded: all of it is undone."""
    fs.mkdir(f"{home}/q")
    with fs.open(f"{home}/q/target", "wb") as f:
        f.write(b"old")
    fs.makedirs(f"{home}/big/sub")
    for k in range(3):
        fs.create(f"{home}/big/sub/f{k}")
    admin_fs.set_quota(f"{home}/q", max_inodes=4)
    with pytest.raises(OSError) as exc:
        fs.rename(f"{home}/big", f"{home}/q/target2")  # 5 inodes into a directory with room for 2
    assert exc.value.errno == errno.EDQUOT
    fs.mkdir(f"{home}/q/emptydir")
    with pytest.raises(OSError) as exc:
        fs.rename(f"{home}/big", f"{home}/q/emptydir")  # replaces the empty directory first
    assert exc.value.errno == errno.EDQUOT
    assert sorted(fs.listdir(f"{home}/q")) == ["emptydir", "target"]
    assert fs.listdir(f"{home}/big/sub") == ["f0", "f1", "f2"]
    with fs.open(f"{home}/q/target") as f:
        assert f.read() == b"old"
    assert fs.get_quota(f"{home}/q").used_inodes == 3  # type: ignore[union-attr]
    admin_fs.set_quota(f"{home}/q")
