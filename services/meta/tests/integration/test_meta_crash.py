"""Meta SIGKILLed in the middle of creates, writes, renames, truncates and removes from several clients, and
restarted on the same database: the tree stays consistent and every acknowledged operation is there once. A client
SIGKILLed mid-write: its write session is reclaimed, the length settles on what storage holds, others write on.

Consistency is read from meta's own SQLite file (the INOD/DENT tables) and the storage targets' chunk tables:
no entry names a missing inode, no inode is lost, link counts and directory quotas' usage match the tree, and
the chunks of removed files leave storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import hf3fs
from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from ff_testing.cluster import Cluster, running_cluster
from ff_testing.waiting import wait_until
from fireflyer.meta.v1 import meta_pb2 as pb

LEASE_S = 3.0
META = {
    "session_lease_s": LEASE_S,
    "background_interval_s": 0.3,
    "default_chunk_size": 1 << 16,
    "writable_capability_ttl_s": 2.0,  # writers renew theirs across meta's restarts too
}
NUM_CLIENTS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("metacrash"), meta=META) as c:
        yield c


def _restart_meta(cluster: Cluster) -> None:
    """SIGKILL meta and start it again where it listened, on the same database."""
    meta = cluster.meta[0]
    meta.kill()
    meta.start_again()
    asyncio.run(meta.ready())


def _until_answered(op: Callable[[], object], accepted: tuple[int, ...] = ()) -> str:
    """Run ``op`` until meta answers it, as a client retrying after meta restarts does.

    Returns "ok", or the errno name of an ``accepted`` error (what a retry of an operation that had applied gets).
    """
    deadline = time.monotonic() + 60
    while True:
        try:
            op()
            return "ok"
        except (ConnectionError, TimeoutError):  # meta did not answer: it may or may not have applied it
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        except OSError as err:
            if err.errno in accepted:
                return errno.errorcode[err.errno]
            raise


@dataclass
class Worker:
    """One client in its own folder: rounds of write, rename, truncate, remove, mkdir, rename dir, rmdir."""

    fs: hf3fs.FileSystem
    home: str
    rounds: int = 0
    errors: list[BaseException] = field(default_factory=list)

    def data(self, i: int) -> bytes:
        return (f"{self.home} round {i} ".encode() * 20000)[: 100_000 + i]

    def one_round(self, i: int) -> None:
        h = self.home

        def write() -> None:
            with self.fs.open(f"{h}/f{i}", "wb") as f:
                f.write(self.data(i))

        _until_answered(write)
        _until_answered(lambda: self.fs.rename(f"{h}/f{i}", f"{h}/g{i}"), (errno.ENOENT,))
        _until_answered(lambda: self.fs.truncate(f"{h}/g{i}", 70_000))
        if i >= 2:
            _until_answered(lambda: self.fs.remove(f"{h}/g{i - 2}"), (errno.ENOENT,))
        _until_answered(lambda: self.fs.mkdir(f"{h}/d{i}"), (errno.EEXIST,))
        _until_answered(lambda: self.fs.rename(f"{h}/d{i}", f"{h}/e{i}"), (errno.ENOENT,))
        if i >= 2:
            _until_answered(lambda: self.fs.rmdir(f"{h}/e{i - 2}"), (errno.ENOENT,))

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.one_round(self.rounds)
                self.rounds += 1
        except BaseException as err:
            self.errors.append(err)

    def expected(self) -> dict[str, bytes | None]:
        """The folder after the last round: the last two files (cut to 70,000 bytes) and folders."""
        last = range(max(0, self.rounds - 2), self.rounds)
        return {**{f"g{i}": self.data(i)[:70_000] for i in last}, **{f"e{i}": None for i in last}}


def _tree_problems(db: Path) -> list[str]:
    """What is inconsistent in meta's tables (empty: nothing)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        problems = [
            f"entry {p}/{n} names missing inode {i}"
            for p, n, i in c.execute(
                "SELECT d.parent_id, d.name, d.inode_id FROM meta_dirents d"
                " LEFT JOIN meta_inodes i ON i.inode_id = d.inode_id WHERE i.inode_id IS NULL"
            )
        ]
        trashed = {r[0] for r in c.execute("SELECT inode_id FROM meta_trash")}
        with_sessions = {r[0] for r in c.execute("SELECT inode_id FROM meta_sessions")}
        links = dict(c.execute("SELECT inode_id, COUNT(*) FROM meta_dirents GROUP BY inode_id").fetchall())
        for inode_id, kind, nlink, parent in c.execute("SELECT inode_id, type, nlink, parent_id FROM meta_inodes"):
            if parent == inode_id or inode_id in trashed:  # the root; a tree in the trash
                continue
            have = links.get(inode_id, 0)
            if have == 0 and inode_id not in with_sessions:
                problems.append(f"inode {inode_id} (type {kind}) is in no folder")
            if kind != 2 and have != nlink:  # (2: a directory, whose link count follows its subfolders)
                problems.append(f"inode {inode_id} has nlink {nlink} and {have} entries")
        problems += _quota_problems(c)
    return problems


def _quota_problems(c: sqlite3.Connection) -> list[str]:
    """Each directory quota's usage against its tree: inodes (the folder too) and file bytes."""
    problems = []
    for qid, used_bytes, used_inodes, reserved in c.execute(
        "SELECT inode_id, used_bytes, used_inodes, reserved_bytes FROM meta_quotas"
    ).fetchall():
        rows = c.execute(
            "WITH RECURSIVE tree(id) AS (SELECT ? UNION SELECT d.inode_id FROM meta_dirents d"
            " JOIN tree ON d.parent_id = tree.id)"
            " SELECT COUNT(*), COALESCE(SUM(CASE WHEN i.type = 1 THEN i.length ELSE 0 END), 0)"
            " FROM tree JOIN meta_inodes i ON i.inode_id = tree.id",
            (qid,),
        ).fetchone()
        if (used_inodes, used_bytes) != tuple(rows):
            problems.append(f"quota of {qid}: used {used_inodes} inodes, {used_bytes} bytes; the tree has {rows}")
        if reserved:
            sessions = c.execute("SELECT COUNT(*) FROM meta_sessions").fetchone()[0]
            if not sessions:
                problems.append(f"quota of {qid}: {reserved} bytes reserved and no write session open")
    return problems


def _session_rows(db: Path, inode_id: int) -> int:
    """Write sessions meta holds for the file, lapsed ones too (Stat counts only those whose lease holds)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        return int(c.execute("SELECT COUNT(*) FROM meta_sessions WHERE inode_id = ?", (inode_id,)).fetchone()[0])


def _stored_inodes(folder: Path) -> set[int]:
    """Inode ids that storage holds chunks of, over every target of every storage service."""
    found: set[int] = set()
    for db in folder.glob("s*/disk*/target-*/meta.sqlite"):
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            found |= {r[0] for r in c.execute("SELECT DISTINCT inode_id FROM chunks")}
    return found


def _live_files(db: Path) -> set[int]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        return {r[0] for r in c.execute("SELECT inode_id FROM meta_inodes WHERE type = 1")}


def test_meta_killed_under_namespace_load_keeps_the_tree_consistent(cluster: Cluster) -> None:
    """Three clients in their own folders (each under a directory quota), meta SIGKILLed twice mid-stream and
    restarted; each client retries what meta did not answer until it does. Afterwards each folder holds exactly
    what the acknowledged rounds leave (a retried rename or remove applied once), the tables are consistent, and
    the chunks of every removed or truncated-away file leave storage."""
    admin = cluster.fs("root")
    clients = [cluster.connect("alice") for _ in range(NUM_CLIENTS)]
    workers = []
    for k, fs in enumerate(clients):
        home = f"/crash-{k}"
        admin.mkdir(home, 0o777)
        admin.set_quota(home, max_bytes=1 << 30, max_inodes=10_000)
        workers.append(Worker(fs, home))
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
    for t in threads:
        t.start()

    def rounds_done(n: int) -> Callable[[], bool]:
        return lambda: all(w.rounds >= n or w.errors for w in workers)

    try:
        for kill in range(5):
            wait_until(rounds_done(2 * (kill + 1)), 60, f"{2 * (kill + 1)} rounds by every client")
            _restart_meta(cluster)
        wait_until(rounds_done(12), 60, "rounds after the restarts")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    try:
        assert [w.errors for w in workers] == [[]] * NUM_CLIENTS
        for w in workers:
            names = set(admin.listdir(w.home))
            assert names == set(w.expected()), (w.home, sorted(names), sorted(w.expected()))
            for name, data in w.expected().items():
                if data is not None:
                    with admin.open(f"{w.home}/{name}", "rb") as f:
                        assert f.read() == data, f"{w.home}/{name}"
    finally:
        for fs in clients:
            fs.close()
    db = cluster.folder / "meta.db"
    wait_until(lambda: not _tree_problems(db), 30, "a consistent tree (write sessions of the kills collected)")
    wait_until(lambda: _stored_inodes(cluster.folder) <= _live_files(db), 30, "removed files' chunks collected")
    assert _tree_problems(db) == []


def test_a_hard_link_to_a_symlink_outlives_its_other_name(cluster: Cluster) -> None:
    """link(2) does not follow a symlink: the new name is a second link of the symlink itself. Removing one name
    must leave the other (a symlink's inode was deleted with its first name: the other entry then named nothing)."""
    fs = cluster.fs("root")
    fs.mkdir("/links")
    fs.set_quota("/links", max_inodes=100)
    fs.symlink("target-somewhere", "/links/a")
    fs.link("/links/a", "/links/b")
    assert fs.lstat("/links/b").nlink == 2
    fs.remove("/links/a")
    assert fs.readlink("/links/b") == "target-somewhere"
    assert fs.lstat("/links/b").nlink == 1
    assert _tree_problems(cluster.folder / "meta.db") == []
    fs.remove("/links/b")
    assert fs.listdir("/links") == []
    assert _tree_problems(cluster.folder / "meta.db") == []
    quota = fs.get_quota("/links")
    assert quota is not None and quota.used_inodes == 1  # the folder alone


KILLED_WRITER = textwrap.dedent("""
    import sys, hf3fs
    fs = hf3fs.connect(sys.argv[1], sys.argv[2])
    f = fs.open(sys.argv[3], sys.argv[4], buffering=0)
    f.write(b"s" * 100_000)
    f.fsync()
    print("synced", flush=True)
    n = 0
    while True:
        f.write(bytes([65 + n % 26]) * 10_000)
        n += 1
        if n == 5:
            print("writing", flush=True)
""")


@pytest.mark.parametrize("mode", ["wb", "ab"])
def test_a_writer_killed_mid_stream_leaves_what_storage_holds_and_others_write_on(cluster: Cluster, mode: str) -> None:
    """A client SIGKILLed while writing (``ab``: holding the file's append lease): its session lapses and is
    collected, the length settles on the end of what storage holds (the synced part and the writes acknowledged
    after it at least), and another client then appends right at that end."""
    fs = cluster.fs("alice")
    path = f"/killed-{mode}"
    args = [sys.executable, "-c", KILLED_WRITER, cluster.mgmtd, cluster.tokens["alice"], path, mode]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == b"synced"
            assert fs.stat(path).size == 100_000  # fsync made it exact
            assert proc.stdout.readline().strip() == b"writing"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    inode_id, db = fs.stat(path).inode_id, cluster.folder / "meta.db"
    wait_until(lambda: not _session_rows(db, inode_id), LEASE_S * 4 + 10, "the killed writer's session collected")
    size = fs.stat(path).size
    with fs.open(path, "rb") as f:
        got = f.read()
    assert len(got) == size >= 150_000
    expected = b"s" * 100_000 + b"".join(bytes([65 + n % 26]) * 10_000 for n in range(size // 10_000))
    # acknowledged writes whole; a write in flight at the kill may have reached some chunks only (zeros elsewhere)
    assert got[:150_000] == expected[:150_000]
    assert all(g in (e, 0) for g, e in zip(got, expected[:size], strict=True))
    with fs.open(path, "ab") as f:  # another client of the same user: it appends right at the settled end
        f.write(b"after the crash")
    assert fs.stat(path).size == size + len(b"after the crash")
    with fs.open(path, "rb") as f:
        assert f.read() == got + b"after the crash"
    assert _tree_problems(cluster.folder / "meta.db") == []


def test_a_truncate_cut_short_by_a_meta_crash_ends_done_or_undone(cluster: Cluster) -> None:
    """Meta removes a shrinking file's chunks from storage, then commits the new length. SIGKILLed in between (a
    storage replica stopped for a moment holds the removals up; the client gives up while meta is down), the
    file must end truncated or whole, never at its old length with its first chunks gone (acknowledged bytes read
    back as zeros, for good)."""
    fs = cluster.fs("alice")
    path, chunk, num_chunks = "/truncated", 1 << 16, 700  # more chunks per chain than one RemoveChunks takes
    marks = [(k * chunk, memoryview(b"chunk %06d" % k)) for k in range(num_chunks)]
    with fs.open(path, "wb", buffering=0) as f:
        f.write_extents(marks)
    with fs.open(path, "rb") as f:
        before = f.read()
    info = asyncio.run(cluster.storage.routing())
    heads = {c.targets[0].node_id for c in info.chains}
    idle = next(p for p in cluster.storage.nodes if p.info["node_id"] not in heads)  # a replica of every chain
    failed: list[BaseException] = []

    def truncate() -> None:
        try:
            fs.truncate(path, 0)
        except OSError as err:  # (Hf3fsError: meta is down)
            failed.append(err)

    truncating = threading.Thread(target=truncate)
    os.kill(idle.info["pid"], signal.SIGSTOP)  # the removals wait for it at every chain
    try:
        truncating.start()
        time.sleep(1.0)  # meta is in its removal calls (if not yet, the truncate does not start: the test is weaker)
        cluster.meta[0].kill()
    finally:
        os.kill(idle.info["pid"], signal.SIGCONT)
    truncating.join(timeout=60)
    cluster.meta[0].start_again()
    asyncio.run(cluster.meta[0].ready())

    def done_or_undone() -> bool:
        with fs.open(path, "rb") as f:
            return f.read() in (b"", before)

    wait_until(done_or_undone, 30, "the file truncated or whole")
    assert _tree_problems(cluster.folder / "meta.db") == []


def _gc_queued(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        return int(c.execute("SELECT COUNT(*) FROM meta_gc_queue").fetchone()[0])


def test_an_open_unlinked_file_outlives_meta_down_for_longer_than_its_lease(cluster: Cluster) -> None:
    """A file open for writing and unlinked (a temporary file) lives while its write session does. Meta SIGKILLed
    and away for longer than the session's lease: its client could not renew, and renews within a quarter lease
    of meta answering again. Meta must not collect the session first (the file then went to GC: its chunks
    deleted under the open file)."""
    db = cluster.folder / "meta.db"
    with cluster.connect("alice") as fs:
        f = fs.open("/scratch", "w+b", buffering=0)
        data = b"scratch data " * 20_000
        f.write(data)
        inode_id = fs.stat("/scratch").inode_id
        fs.remove("/scratch")
        meta = cluster.meta[0]
        meta.kill()
        time.sleep(LEASE_S + 1)  # meta stays away past the session's lease
        meta.start_again()
        asyncio.run(meta.ready())

        def renewed() -> bool:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
                row = c.execute("SELECT lease_expires_at FROM meta_sessions WHERE inode_id = ?", (inode_id,)).fetchone()
            return row is None or row[0] > time.time()

        wait_until(renewed, 30, "the session renewed or collected")
        wait_until(lambda: _gc_queued(db) == 0, 30, "GC idle")
        f.write(b" and more")
        f.seek(0)
        assert f.read() == data + b" and more"
        f.close()
    wait_until(lambda: inode_id not in _stored_inodes(cluster.folder), 30, "the closed file's chunks collected")


def test_a_create_sent_again_after_its_answer_was_lost_is_answered_as_the_first_time(cluster: Cluster) -> None:
    """Meta applied a Create that opens a write session, and the answer never reached the client (meta died, the
    connection broke). The client sends it again under the same session id: it gets the same file and session,
    O_EXCL included (it made the file), and nothing twice; under another session id the file exists (EEXIST)."""
    admin = cluster.fs("root")
    admin.mkdir("/lost-answers", 0o777)
    admin.set_quota("/lost-answers", max_inodes=100)

    async def create_twice() -> tuple[pb.CreateResponse, pb.CreateResponse, RpcError]:
        mg = MgmtdClient([cluster.mgmtd], token=cluster.tokens["alice"])
        meta = hf3fs.MetaClient(mg, cluster.tokens["alice"])
        request = pb.CreateRequest(
            path=pb.PathAt(path="/lost-answers/x"),
            mode=0o644,
            exclusive=True,
            open_mode=pb.OPEN_MODE_WRITE,
            session_id="session-of-the-lost-answer",
            client_id="a-client",
        )
        try:
            first = await meta.call(lambda m: m.create, request)
            again = await meta.call(lambda m: m.create, request)
            request.session_id = "another-session"
            with pytest.raises(RpcError) as other:
                await meta.call(lambda m: m.create, request)
            return first, again, other.value
        finally:
            await meta.close()
            await mg.close()

    first, again, other = asyncio.run(create_twice())
    assert again.inode.inode_id == first.inode.inode_id
    assert again.session.session_id == first.session.session_id == "session-of-the-lost-answer"
    assert hf3fs.meta_client.os_error(other).errno == errno.EEXIST
    assert _session_rows(cluster.folder / "meta.db", first.inode.inode_id) == 1
    quota = admin.get_quota("/lost-answers")
    assert quota is not None and quota.used_inodes == 2  # the folder and the file, once


def test_an_exclusive_create_waits_out_a_meta_restart(cluster: Cluster) -> None:
    """open("xb") while meta is down for longer than one call's retries: the client sends the Create again (under
    its session id, so a Create meta applied and could not answer is not made twice) until meta answers."""
    with cluster.connect("alice") as fs:
        meta = cluster.meta[0]
        meta.kill()
        opened: list[object] = []

        def open_new() -> None:
            try:
                opened.append(fs.open("/made-after-restart", "xb"))
            except OSError as err:  # (Hf3fsError: meta did not answer)
                opened.append(err)

        opener = threading.Thread(target=open_new)
        opener.start()
        time.sleep(4.0)  # longer than the meta client's own retries (~2.5 s)
        meta.start_again()
        asyncio.run(meta.ready())
        opener.join(timeout=60)
        assert len(opened) == 1 and not isinstance(opened[0], OSError), opened
        with opened[0] as f:  # type: ignore[attr-defined]
            f.write(b"made")
        assert fs.stat("/made-after-restart").size == 4
