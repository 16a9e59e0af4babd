"""Write-back of small files: ``close()`` queues the file, a flusher thread commits queued files in batches.

A file opened ``"wb"``/``"w"`` with write-back on (``hf3fs.connect(writeback=True)`` or ``fs.open(...,
writeback=True)``) is kept in client memory while it is written; its ``close()`` queues it and returns. The
flusher commits a batch when ``max_files`` files or ``max_bytes`` bytes are queued, when the oldest has waited
``max_delay_s``, or when a caller waits for it (a sync point): one meta ``BatchCreate`` for the whole batch
(each file created or truncated with a write session, its quota reserved in the same transaction), one storage
``BatchWrite`` per chain head carrying every chunk of the batch, and one meta ``BatchClose``. That is the way
JuiceFS's ``--writeback`` and NFS's asynchronous writes go, with CephFS's batched creates at meta.

Semantics (see ``hf3fs/README.md``, "Write-back of small files"):

- this client sees its queued files as committed: any call on a queued path, on a folder above one or on a path
  below one (stat, open, listdir, rename, remove, truncate, ...) commits the queue first (paths as written: a
  path that reaches a queued file through a symlink does not count);
- other clients see a file once its batch committed: at most ``max_delay_s`` after its close, plus the commit;
- ``fs.sync()`` and ``fs.close()`` commit everything queued and raise ``WritebackError`` naming every file whose
  commit failed since the last sync point; failures are also logged when they happen, and a process exiting
  with files queued commits them (atexit) and logs what failed. ``f.fsync()`` on a write-back file writes it
  through at once (errors raised there);
- errors of a deferred commit (the folder missing, permission, the name a folder, quota) surface at the next
  sync point, not at ``open``/``close``: a file whose create failed does not exist, one whose quota could not be
  reserved is not created, one whose data did not reach storage is left with what storage holds (usually empty).
"""

from __future__ import annotations

import errno
import io
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import grpc

from ff_fsprotocol.layout import FileLayout
from ff_rpc import Identity, RpcError, acting_as, current_acting
from ff_rpc.client import UnaryCall
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.meta.v1.meta_client import MetaServiceClient
from hf3fs.files import ClientCalls
from hf3fs.meta_client import ERRNO_OF_FS_ERROR, Hf3fsError, MetaClient, os_error
from hf3fs.storage_client import ChunkWrite, StorageIoError

T = TypeVar("T")
RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")
logger = logging.getLogger(__name__)
MAX_BATCH_ITEMS = 1024  # meta's bound on a BatchCreate / BatchClose
ITEMS_PER_TIMEOUT = 32  # a batch call may take the FileSystem's timeout_s per this many items
BATCH_ATTEMPTS = 3  # tries of a batch call that timed out


class WritebackHost(ClientCalls, Protocol):
    """What the write-back needs of its file system's connection (``hf3fs.fs.connection.Connection``).

    The queue reaches its file system only through this, so ``writeback`` never imports ``fs``.
    """

    @property
    def timeout_s(self) -> float:
        """The deadline of one meta call (a batch call gets more, ``ITEMS_PER_TIMEOUT``)."""
        ...

    @property
    def close_retry_s(self) -> float:
        """How long a batch call waits for meta to answer again (as a close does)."""
        ...

    @property
    def meta(self) -> MetaClient:
        """The meta client (a batch call's own deadline)."""
        ...

    def layout(self, inode: pb.Inode) -> FileLayout:
        """The file's chains (``Connection.layout``)."""
        ...


@dataclass(frozen=True)
class WritebackOptions:
    """When the flusher commits (whichever comes first) and what is written back.

    Defaults: a batch of 256 files or 16 MiB costs meta and storage about what 3-4 single files do, so batches
    of that size bring the per-file cost down to a few percent of a synchronous close; 50 ms bounds how late
    another client sees a file (NFS's close-to-open is stricter, its async writes far looser) and is short
    enough that a single slow writer is not kept waiting at a sync point. Two flushers: while one batch waits
    for storage's fsyncs, the next one's creates run at meta (a file is in one batch at a time). Files above
    ``max_file_bytes`` (1 MiB) are written through: a large file pays nothing per batch anyway. ``close()``
    waits (backpressure) while ``max_queued_bytes`` or ``4 * max_files`` files are queued.
    """

    max_files: int = 256
    max_bytes: int = 16 << 20
    max_delay_s: float = 0.05
    max_file_bytes: int = 1 << 20
    max_queued_bytes: int = 64 << 20
    flushers: int = 2  # batches committed at once (one creating while another writes storage)

    def __post_init__(self) -> None:
        if not 1 <= self.max_files <= MAX_BATCH_ITEMS:
            raise ValueError(f"max_files must be 1..{MAX_BATCH_ITEMS}")
        if self.max_bytes <= 0 or self.max_file_bytes < 0 or self.max_delay_s < 0:
            raise ValueError("max_bytes must be positive, max_file_bytes and max_delay_s not negative")
        if not 1 <= self.flushers <= 16:
            raise ValueError("flushers must be 1..16")
        if self.max_queued_bytes < self.max_file_bytes:
            raise ValueError("max_queued_bytes must hold at least one file of max_file_bytes")


class WritebackError(OSError):
    """Files whose deferred commit failed: ``failures`` lists (path, OSError), in the order they failed."""

    def __init__(self, failures: list[tuple[str, OSError]]) -> None:
        shown = "; ".join(f"{p}: {e.strerror or e}" for p, e in failures[:10])
        more = f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""
        super().__init__(errno.EIO, f"{len(failures)} written-back file(s) failed to commit: {shown}{more}")
        self.failures = failures


@dataclass
class PendingFile:
    """A closed small file waiting for its batch: its whole content, permission bits and write time."""

    path: str  # absolute path (the file's name in errors)
    data: bytes
    perm: int = 0o644
    mtime_ns: int = 0
    parent: tuple[int, str] | None = None  # (folder inode id, name): created there instead of at ``path``
    acting: Identity | None = None  # the caller it is committed as (a multi-user mount's caller)
    set_mode: bool = False  # ``perm`` for a file that exists too (one created earlier), not only a new one
    # Nonzero: the file exists already as this inode (created earlier, its bytes held until now): written back
    # only into that file, wherever another client may have moved it meanwhile, never into a file that took its name.
    inode_id: int = 0
    quota_id: int = 0  # the folder of the byte quota it counts against (0: none given)
    seq: int = 0
    queued_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        check_carried(
            self.parent[1] if self.parent else self.path, self.perm, self.mtime_ns, self.parent[0] if self.parent else 0
        )

    @property
    def key(self) -> str:
        """The file's key in the queue (its canonical path, or folder inode and name): a later version replaces it."""
        return f"@{self.parent[0]}/{self.parent[1]}" if self.parent else canonical(self.path)


def check_carried(path: str, perm: int, mtime_ns: int = 0, folder_id: int = 0) -> None:
    """Refuse, when a file is queued, what no Create/Close could carry.

    Else building the batch's requests fails in the flusher, failing every file of the batch with it.

    Raises:
        ValueError: ``path`` not UTF-8 (a lone surrogate of ``os.fsdecode``: UnicodeEncodeError), ``perm`` not a
            uint32, ``mtime_ns`` not an int64, ``folder_id`` not a uint64.
    """
    path.encode()
    if not 0 <= perm < 1 << 32:
        raise ValueError(f"perm out of range: {perm}")
    if not -(1 << 63) <= mtime_ns < 1 << 63:
        raise ValueError(f"mtime_ns out of range: {mtime_ns}")
    if not 0 <= folder_id < 1 << 64:
        raise ValueError(f"folder inode id out of range: {folder_id}")


def places_of(request: Any) -> list[tuple[int, str]]:
    """The (folder inode id or 0, path) of every PathAt a meta request names (``path``, ``src_path``, ...)."""
    out: list[tuple[int, str]] = []
    for fd, value in request.ListFields():
        if fd.message_type is not pb.PathAt.DESCRIPTOR:
            continue
        for at in [value] if isinstance(value, pb.PathAt) else value:
            out.append((at.parent_inode_id, at.path))
    return out


def canonical(path: str) -> str:
    """``path`` without empty and ``.`` components, as meta resolves it (``d//a`` and ``d/./a`` are ``d/a``).

    ``..`` stays (through a symlink it is not the folder above).
    """
    return "/" + "/".join(p for p in path.split("/") if p not in ("", "."))


def _under(path: str, other: str) -> bool:
    """Whether ``other`` is ``path`` or lies below it (paths as meta resolves them, ``..`` and symlinks aside)."""
    path, other = canonical(path), canonical(other)
    return other == path or other.startswith(path.rstrip("/") + "/")


@dataclass(frozen=True)
class WritebackStats:
    """A write-back queue's counts: files waiting and being committed now, and files handled so far.

    Every file queued is settled once its batch ends (``submitted - settled`` are still to come; a file queued again
    before its commit replaces the queued version and is counted once); ``failed`` of the settled ones were not
    committed (the errors ``FileSystem.sync`` raises).
    """

    queued: int = 0
    in_flight: int = 0
    submitted: int = 0
    settled: int = 0
    failed: int = 0
    batches: int = 0


def _touches(path: str, item: PendingFile, folder_blind: bool) -> bool:
    """Whether a call naming ``path`` touches a file queued at its path (see ``Writeback.related``)."""
    if _under(item.path, path):  # the file itself, or a path below it
        return True
    return _under(path, item.path) and not (folder_blind and item.inode_id)  # a folder above it


class Writeback:
    """The queue and flusher of one FileSystem (made by it: see ``FileSystem.write_back``)."""

    def __init__(self, host: WritebackHost, options: WritebackOptions) -> None:
        self._host = host
        self.options = options
        self._cond = threading.Condition()
        self._queue: dict[str, PendingFile] = {}
        self._queued_bytes = 0
        self._inflight: dict[str, PendingFile] = {}
        self._errors: list[tuple[str, OSError]] = []
        self._seq = 0
        self._waiters = 0
        self._stopping = False
        self.batches = 0  # batches committed (for tests and the bench)
        self._submitted = 0  # files queued so far (a file queued again before its commit counts again)
        self._settled = 0  # files whose commit ended, committed or failed (replaced in the queue: not counted)
        self._failed = 0  # files whose commit failed
        self._threads = [
            threading.Thread(target=self._loop, name=f"hf3fs-writeback-{i}", daemon=True)
            for i in range(options.flushers)
        ]
        for t in self._threads:
            t.start()

    # ---- callers ----

    def submit(self, item: PendingFile) -> None:
        """Queue a closed file (replacing a queued version of the same file); waits while the queue is full."""
        limit_files = 4 * self.options.max_files
        with self._cond:
            if self._stopping:
                raise ValueError("the file system is closed")
            while self._queue and (
                self._queued_bytes + len(item.data) > self.options.max_queued_bytes or len(self._queue) >= limit_files
            ):
                self._cond.wait()
            old = self._queue.pop(item.key, None)
            if old is not None:
                self._queued_bytes -= len(old.data)
                self._submitted -= 1  # the newer version replaces it: one file to settle, not two
            self._submitted += 1
            self._seq += 1
            item.seq = self._seq
            self._queue[item.key] = item
            self._queued_bytes += len(item.data)
            self._cond.notify_all()

    def busy(self) -> bool:
        """Whether files are queued or being committed (a snapshot, without the lock)."""
        return bool(self._queue or self._inflight)

    def pending(self) -> int:
        """How many files are queued or being committed."""
        with self._cond:
            return len(self._queue) + len(self._inflight)

    def stats(self) -> WritebackStats:
        """What the queue holds now and has done so far."""
        with self._cond:
            return WritebackStats(
                queued=len(self._queue),
                in_flight=len(self._inflight),
                submitted=self._submitted,
                settled=self._settled,
                failed=self._failed,
                batches=self.batches,
            )

    def held_bytes(self, quota_id: int) -> int:
        """Bytes of the queued and in-flight files that count against the quota of folder ``quota_id``."""
        with self._cond:
            return sum(len(i.data) for i in [*self._queue.values(), *self._inflight.values()] if i.quota_id == quota_id)

    def on_flusher(self) -> bool:
        """Whether the calling thread is one of the flushers (which must not wait on the queue they empty)."""
        return threading.current_thread() in self._threads

    def related(
        self, places: Iterable[tuple[int, str]], *, makes_name: bool = False, folder_blind: bool = False
    ) -> bool:
        """Whether a call on ``places`` ((folder inode id or 0, path)) touches a queued file.

        It touches one at its own path, at a folder above it, or (relative to a folder inode) in that folder. A call
        by inode alone, or relative to a folder when queued files have no folder inode, counts as touching (the safe
        side). Files queued by ``inode_id`` are in meta already (the mount's, created at once), so two kinds of call
        need less of them: ``makes_name`` (mkdir, symlink, mknod, an exclusive create) none at all, their names
        answer EEXIST or ENOTDIR as they are; ``folder_blind`` (a stat) only when it names the file or a path below
        it, since a folder's own attributes do not depend on the bytes of the files in it (``tar x``'s lookups of
        the folders it fills waited for their batches). A listing or a setattr still commits the files below.
        """
        with self._cond:
            items = [*self._queue.values(), *self._inflight.values()]
        if makes_name:
            items = [i for i in items if not i.inode_id]
        if not items:
            return False
        for inode_id, path in places:
            if not inode_id:
                if any(_touches(path, i, folder_blind) for i in items if not i.parent):
                    return True
                if any(i.parent for i in items):  # queued by folder inode: cannot compare with a path
                    return True
            elif not path or any(i.parent is None or i.parent[0] == inode_id for i in items):
                return True
        return False

    def flush(self) -> None:
        """Commit everything queued up to now (and wait for it); errors stay for ``take_errors``."""
        with self._cond:
            target = self._seq
            self._waiters += 1
            self._cond.notify_all()
            try:
                while any(i.seq <= target for i in [*self._queue.values(), *self._inflight.values()]):
                    self._cond.wait()
            finally:
                self._waiters -= 1

    def take_errors(self) -> list[tuple[str, OSError]]:
        """The commit failures since the last call, as (path, error), and forgets them."""
        with self._cond:
            errors, self._errors = self._errors, []
        return errors

    def close(self) -> None:
        """Commit what is queued, then stop the flusher."""
        self.flush()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=60)

    # ---- the flusher ----

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if not batch:
                continue
            try:
                self._commit(batch)
            except BaseException as exc:  # a bug must not drop files silently: every file of the batch fails
                logger.exception("write-back: committing %d file(s) failed", len(batch))
                err = exc if isinstance(exc, OSError) else OSError(errno.EIO, f"write-back failed: {exc!r}")
                self._fail([(i.path, err) for i in batch])
            with self._cond:
                for item in batch:
                    if self._inflight.get(item.key) is item:
                        del self._inflight[item.key]
                self.batches += 1
                self._settled += len(batch)
                self._cond.notify_all()

    def _next_batch(self) -> list[PendingFile] | None:
        o = self.options
        with self._cond:
            while True:
                ready = [k for k in self._queue if k not in self._inflight]  # a file in one batch at a time
                if ready:
                    break
                if self._stopping and not self._queue:
                    return None
                self._cond.wait()
            while not (
                self._waiters or self._stopping or len(ready) >= o.max_files or self._queued_bytes >= o.max_bytes
            ):
                left = self._queue[ready[0]].queued_at + o.max_delay_s - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
                ready = [k for k in self._queue if k not in self._inflight]
                if not ready:
                    return []
            batch: list[PendingFile] = []
            size = 0
            for key in ready:
                item = self._queue[key]
                if batch and (len(batch) >= o.max_files or size + len(item.data) > o.max_bytes):
                    break
                batch.append(self._queue.pop(key))
                self._inflight[key] = item
                size += len(item.data)
            self._queued_bytes -= size
            self._cond.notify_all()  # room for waiting submitters
            return batch

    def _fail(self, failures: list[tuple[str, OSError]]) -> None:
        if not failures:
            return
        logger.warning(
            "write-back: %d file(s) failed to commit: %s",
            len(failures),
            "; ".join(f"{p}: {e}" for p, e in failures[:20]),
        )
        with self._cond:
            self._errors += failures
            self._failed += len(failures)

    def _commit(self, batch: list[PendingFile]) -> None:
        groups: dict[Identity | None, list[PendingFile]] = {}
        for item in batch:
            groups.setdefault(item.acting, []).append(item)
        for identity, items in groups.items():
            with acting_as(identity):
                self._commit_group(items)

    def _commit_group(self, items: list[PendingFile]) -> None:
        """BatchCreate, one storage batch write, BatchClose; each file's failure recorded alone."""
        host = self._host
        opened = self._create(items)
        if not opened:
            return
        ios: list[ChunkWrite] = []
        owners: list[int] = []
        for k, (item, resp) in enumerate(opened):
            layout = host.layout(resp.inode)
            view = memoryview(item.data)
            for s in layout.spans(0, len(item.data)):
                ios.append(
                    ChunkWrite(
                        chain_id=s.chain_id,
                        inode_id=layout.inode_id,
                        chunk_index=s.chunk_index,
                        offset=s.offset,
                        data=view[s.file_offset : s.file_offset + s.length],
                        chunk_size=layout.chunk_size,
                        capability=resp.io_capability.token,
                    )
                )
                owners.append(k)
        failed: dict[int, OSError] = {}
        if ios:
            try:
                outcomes = host.run(host.storage.batch_write(ios))
            except StorageIoError as err:
                outcomes = []
                failed = {k: OSError(errno.EIO, f"write refused by storage: {err}") for k in range(len(opened))}
            for k, o in zip(owners, outcomes, strict=False):
                if not o.ok and k not in failed:
                    failed[k] = OSError(errno.EIO, f"write failed: {o.message or o.status}")
        self._close(opened, failed)

    def _create(self, items: list[PendingFile], relocated: bool = False) -> list[tuple[PendingFile, pb.CreateResponse]]:
        requests = [
            pb.CreateRequest(
                path=pb.PathAt(parent_inode_id=i.parent[0], path=i.parent[1]) if i.parent else pb.PathAt(path=i.path),
                mode=i.perm,
                open_mode=pb.OPEN_MODE_WRITE,
                truncate=True,
                session_id=uuid.uuid4().hex,
                client_id=self._host.client_id,
                reserve_bytes=len(i.data),
                set_mode=i.perm if i.set_mode else None,
                expect_inode_id=i.inode_id,
            )
            for i in items
        ]
        try:
            resp = self._batch_call(lambda m: m.batch_create, pb.BatchCreateRequest(creates=requests), len(requests))
        except OSError as err:
            self._fail([(i.path, err) for i in items])
            return []
        opened, failures, moved = [], [], []
        for item, r in zip(items, resp.results, strict=True):
            if r.error == pb.FS_ERROR_STALE and not relocated:
                moved.append(item)
            elif r.error:
                failures.append((item.path, _os_error(r.error, r.message, item.path)))
            else:
                opened.append((item, r.response))
        self._fail(failures)
        return opened + (self._create(self._relocate(moved), relocated=True) if moved else [])

    def _relocate(self, items: list[PendingFile]) -> list[PendingFile]:
        """The files whose path names another file by now, each at its path now (another client renamed a folder above).

        One removed meanwhile is left out: its bytes go with it, as a removed open file's do.
        """
        found = []
        for item in items:
            try:
                where = self._host.meta_call(
                    lambda m: m.realpath, pb.RealpathRequest(path=pb.PathAt(parent_inode_id=item.inode_id)), item.path
                )
            except FileNotFoundError:
                logger.info("write-back: %s was removed before its bytes were written back", item.path)
                continue
            except OSError as err:
                self._fail([(item.path, err)])
                continue
            logger.info("write-back: %s is %s by now", item.path, where.path)
            found.append(replace(item, path=str(where.path), parent=None))
        return found

    def _batch_call(
        self, method: Callable[[MetaServiceClient], UnaryCall[RequestT, ResponseT]], request: RequestT, items: int
    ) -> ResponseT:
        """A BatchCreate or BatchClose, with a deadline that grows with the batch, tried again when it runs out.

        Meta on a loaded machine takes a while over hundreds of items. The same request again is safe, as its files
        are never exclusive and their write sessions have the ids this client chose (meta returns the session a first
        attempt opened). No meta answering (a restart, a failover) is waited out as a Close does, up to the
        FileSystem's ``close_retry_s`` (60 s): the files' bytes exist nowhere else.

        Raises:
            OSError: meta refused the call or did not answer (Hf3fsError).
        """
        host = self._host
        timeout = host.timeout_s * max(1.0, items / ITEMS_PER_TIMEOUT)
        deadline = time.monotonic() + host.close_retry_s
        attempt, delay = 0, 0.1
        while True:
            try:
                return host.run(host.meta.call(method, request, timeout_s=timeout))
            except RpcError as err:
                attempt += 1
                if _timed_out(err) and attempt < BATCH_ATTEMPTS:
                    logger.info("write-back: a batch call of %d items timed out after %.0f s; again", items, timeout)
                    continue
                raise os_error(err) from None
            except Hf3fsError as err:  # no meta instance answered
                if time.monotonic() + delay > deadline:
                    raise
                logger.info("write-back: a batch call of %d items: %s; again in %.1f s", items, err, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _close(self, opened: list[tuple[PendingFile, pb.CreateResponse]], failed: dict[int, OSError]) -> None:
        closes = [
            pb.CloseRequest(
                inode_id=r.inode.inode_id,
                session_id=r.session.session_id,
                mtime_ns=i.mtime_ns,
                written_length_bytes=0 if k in failed else len(i.data),
            )
            for k, (i, r) in enumerate(opened)
        ]
        failures = [(opened[k][0].path, err) for k, err in failed.items()]
        try:
            resp = self._batch_call(lambda m: m.batch_close, pb.BatchCloseRequest(closes=closes), len(closes))
        except OSError as err:  # the sessions lapse and meta collects them (lengths from storage)
            failures += [(i.path, err) for k, (i, _) in enumerate(opened) if k not in failed]
        else:
            for k, ((item, _), r) in enumerate(zip(opened, resp.results, strict=True)):
                if r.error and k not in failed:
                    failures.append((item.path, _os_error(r.error, r.message, item.path)))
        self._fail(failures)


def _timed_out(err: RpcError) -> bool:
    return err.code is grpc.StatusCode.DEADLINE_EXCEEDED


def _os_error(code: int, message: str, path: str) -> OSError:
    number = ERRNO_OF_FS_ERROR.get(pb.FsError.Name(code), errno.EIO)  # type: ignore[arg-type]
    return OSError(number, message or errno.errorcode.get(number, ""), path)


class WritebackFile(io.BufferedIOBase):
    """A small file being written with write-back (``FileSystem.open(..., "wb")``): its bytes stay here until close.

    ``close()`` queues it. Growing past ``max_file_bytes``, or ``fsync()``, writes it through: it then goes on as
    an ordinary file (created and written now, errors raised by the calls themselves).
    """

    def __init__(
        self, queue: Writeback, open_through: Callable[[str, int], Any], path: str, mode: str, perm: int
    ) -> None:
        """A new file at ``path``, queued on ``queue`` at close; ``open_through(path, perm)`` opens it ``"wb"``.

        ``open_through`` opens it as an ordinary file, should it be written through.
        """
        check_carried(path, perm)  # before the file object exists (its close would queue it)
        super().__init__()
        self._queue = queue
        self._open_through = open_through
        self.name = path
        self.mode = mode
        self._perm = perm
        self._limit = queue.options.max_file_bytes
        self._buf = bytearray()
        self._pos = 0
        self._acting = current_acting()
        self._direct: Any = None  # the ordinary file once written through
        self._broken = False  # writing through failed: close queues nothing (the error was raised)
        self._last_write_ns = time.time_ns()

    def writable(self) -> bool:
        """Always True: a write-back file is opened for writing."""
        return True

    def seekable(self) -> bool:
        """Always True: the bytes are in memory (or in the file written through)."""
        return True

    def write(self, b: Any) -> int:
        """Writes ``b`` at the position; past ``max_file_bytes`` the file is written through first. Returns len(b)."""
        self._check()
        if self._direct is not None:
            return int(self._direct.write(b))
        data = memoryview(b).cast("B")
        end = self._pos + len(data)
        if end > self._limit:
            return int(self._write_through().write(data))
        if end > len(self._buf):
            self._buf.extend(bytes(end - len(self._buf)))
        self._buf[self._pos : end] = data
        self._pos = end
        self._last_write_ns = time.time_ns()
        return len(data)

    def tell(self) -> int:
        """The position, as ``io`` files have it."""
        self._check()
        return int(self._direct.tell()) if self._direct is not None else self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Moves the position, as ``io`` files do; a position past the end leaves a hole of zeros once written.

        Raises:
            ValueError: an unknown ``whence``.
            OSError: EINVAL for a position before the start.
        """
        self._check()
        if self._direct is not None:
            return int(self._direct.seek(offset, whence))
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._buf)}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence}")
        if base + offset < 0:
            raise OSError(errno.EINVAL, "negative seek position", self.name)
        self._pos = base + offset
        return self._pos

    def truncate(self, size: int | None = None) -> int:
        """Cuts or extends (with zeros) the file to ``size`` (default: the position); past ``max_file_bytes``, through.

        Raises:
            OSError: EINVAL for a negative size.
        """
        self._check()
        if self._direct is not None:
            return int(self._direct.truncate(size))
        size = self._pos if size is None else size
        if size < 0:
            raise OSError(errno.EINVAL, "negative size", self.name)
        if size > self._limit:
            return int(self._write_through().truncate(size))
        del self._buf[size:]
        self._buf.extend(bytes(size - len(self._buf)))
        return size

    def flush(self) -> None:
        """Nothing to do until ``close`` (the bytes stay in client memory); ``fsync`` commits them now."""
        if self._direct is not None and not self._direct.closed:
            self._direct.flush()

    def fsync(self) -> None:
        """Write the file through now (create, write, make its length exact on meta): errors raised here."""
        self._check()
        self._write_through().fsync()

    def close(self) -> None:
        """Queues the file for write-back (or closes the file written through); errors come from ``sync``/``close``."""
        if self.closed:
            return
        try:
            if self._direct is not None:
                self._direct.close()
            elif not self._broken:
                self._queue.submit(
                    PendingFile(
                        path=self.name,
                        data=bytes(self._buf),
                        perm=self._perm,
                        mtime_ns=self._last_write_ns,
                        acting=self._acting,
                    )
                )
        finally:
            super().close()

    def _write_through(self) -> Any:
        """The ordinary file this one now is (created and written with what was buffered)."""
        if self._direct is not None:
            return self._direct
        self._broken = True
        with acting_as(self._acting):
            direct = self._open_through(self.name, self._perm)
            try:
                direct.write(self._buf)
                direct.seek(self._pos)
            except BaseException:
                direct.close()
                raise
        self._broken = False
        self._direct = direct
        self._buf = bytearray()
        return direct

    def _check(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")
