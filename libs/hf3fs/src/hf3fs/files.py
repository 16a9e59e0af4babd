"""File objects of hf3fs: a RawIOBase whose reads and writes go straight to storage, wrapped in io's classes.

Reads and writes go as whole-chunk batches through the file's layout; the raw file is wrapped in io's buffered
classes and, for text modes, a TextIOWrapper.
"""

from __future__ import annotations

import errno
import functools
import io
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ff_fsprotocol.layout import FileLayout
from ff_rpc.client import UnaryCall
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.meta.v1.meta_client import MetaServiceClient
from hf3fs.spans import read_spans, write_spans
from hf3fs.storage_client import StorageClient

logger = logging.getLogger(__name__)
T = TypeVar("T")
RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")

MAX_IO_BATCH_BYTES = 32 << 20
# A chunk's head applies a batch's writes to it one after another (one chain round each, ~20 ms on a loaded
# machine): 1,024 in one batch outlasted a storage call's 20 s timeout, and the flush failed with EIO.
MAX_CHUNK_WRITES_PER_BATCH = 64
MAX_FILE_BYTES = (1 << 62) - 1  # meta's lengths are below 2^62
MAX_CHUNKS_PER_FILE = 1 << 40  # storage's chunk indexes are below 2^40
NO_LIMIT = (1 << 64) - 1
RESERVE_STEP_BYTES = 64 << 20
CAPABILITY_MARGIN_NS = 60 * 10**9
CAPABILITY_RETRY_NS = 2 * 10**9  # a refresh meta did not answer, while the capability held is still good
APPEND_LEASE_PREFIX = "append-lease-"  # the write session that serializes appends to one inode
APPEND_WAIT_S = 90.0  # a dead holder's lease (30 s by default) lapses and meta collects it well before this


class ClientCalls(Protocol):
    """What open files and the write-back call on their file system's client: its id, storage, loop and meta."""

    @property
    def client_id(self) -> str:
        """The id meta knows this client's write sessions by."""
        ...

    @property
    def storage(self) -> StorageClient:
        """The storage client the file's chunks go through."""
        ...

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the file system's event loop and wait for it (as the calling thread's identity)."""
        ...

    def meta_call(
        self,
        method: Callable[[MetaServiceClient], UnaryCall[RequestT, ResponseT]],
        request: RequestT,
        path: str | None = None,
    ) -> ResponseT:
        """One meta call (for a file: after write-back flushed what it concerns); OSError for ``path`` when refused."""
        ...


class FileBackend(ClientCalls, Protocol):
    """What an open file needs of the file system that opened it (``FileSystem`` hands one to each file).

    Files reach the file system only through this, so ``files`` never imports ``fs``.
    """

    def local_length(self, inode_id: int) -> int:
        """The furthest any open writer of this client wrote into ``inode_id`` (0 if none)."""
        ...

    def append_guard(self, inode_id: int) -> AbstractContextManager[None]:
        """Held while this client appends to ``inode_id`` (one appending thread per inode)."""
        ...

    def close_session(self, request: pb.CloseRequest, path: str) -> None:
        """Close a write session, retried while meta cannot be reached (``FileSystem`` says how long)."""
        ...


@dataclass(frozen=True)
class OpenMode:
    """An ``open()`` mode string taken apart: what the file may do and how opening it treats an existing file."""

    readable: bool
    writable: bool
    append: bool
    create: bool
    exclusive: bool
    truncate: bool
    binary: bool

    @classmethod
    def parse(cls, mode: str) -> OpenMode:
        """The mode of ``mode`` (``"r"``, ``"wb"``, ``"a+"``, ``"x"``...), as ``open()`` accepts them.

        Raises:
            ValueError: not one of ``r``/``w``/``a``/``x`` with optional ``+`` and one of ``b``/``t``.
        """
        chars = set(mode)
        kinds = chars & set("rwax")
        if len(kinds) != 1 or len(mode) != len(chars) or chars - set("rwaxbt+") or {"b", "t"} <= chars:
            raise ValueError(f"invalid mode: {mode!r}")
        kind = kinds.pop()
        plus = "+" in chars
        return cls(
            readable=kind == "r" or plus,
            writable=kind != "r" or plus,
            append=kind == "a",
            create=kind in "wax",
            exclusive=kind == "x",
            truncate=kind == "w",
            binary="b" in chars,
        )


class RawFile(io.RawIOBase):
    """One open hf3fs file. Not for direct use: ``FileSystem.open`` wraps it in buffered/text layers."""

    def __init__(
        self,
        fs: FileBackend,
        path: str,
        mode: str,
        om: OpenMode,
        inode: pb.Inode,
        layout: FileLayout,
        capability: bytes,
        session: pb.WriteSession | None,
    ) -> None:
        super().__init__()
        self._fs = fs
        self.name = path
        self.mode = mode
        self._om = om
        self.inode_id = inode.inode_id
        self.inode_at_open = inode  # meta's answer to the Open or Create (the mount keeps its attributes)
        self.layout = layout
        self.max_bytes = min(MAX_FILE_BYTES, layout.chunk_size * MAX_CHUNKS_PER_FILE)  # where the file must end
        self._cap = capability
        self.cap_expires_at_ns = 0  # 0: unknown (never refreshed ahead of time)
        self._cap_margin_ns = CAPABILITY_MARGIN_NS  # refreshed this long before it expires
        self._cap_retry_at_ns = 0  # a refresh meta did not answer is tried again from then (monotonic)
        self._session = session
        self._limit = session.write_limit_bytes if session is not None else NO_LIMIT
        self.length = inode.length_bytes
        self.written = 0  # highest offset written by this session
        self.meta_length = inode.length_bytes  # the length meta gave in its last answer to this file object
        self._last_write_ns: int | None = None
        self._pos = 0
        self._lock = threading.Lock()
        self.lost = False

    # ---- io.RawIOBase ----

    def readable(self) -> bool:
        """Whether the mode reads."""
        return self._om.readable

    def writable(self) -> bool:
        """Whether the mode writes."""
        return self._om.writable

    def seekable(self) -> bool:
        """Always True: any position may be read or written."""
        return True

    def tell(self) -> int:
        """The position, in bytes from the start."""
        self._check_open()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Moves the position; ``SEEK_END`` asks meta for the length now (another writer may have grown the file).

        Raises:
            ValueError: an unknown ``whence``.
            OSError: EINVAL for a position before the start.
        """
        self._check_open()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.refresh_length() + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(errno.EINVAL, "negative seek position", self.name)
        self._pos = pos
        return pos

    def readinto(self, buffer: Any) -> int:
        """Reads into ``buffer`` at the position (zeros for holes); 0 at the end of the file (meta is asked where)."""
        self._check_open()
        if not self._om.readable:
            raise io.UnsupportedOperation("not readable")
        view = memoryview(buffer).cast("B")
        if self._pos + len(view) > self.length:  # past the end known here: the file may have grown since
            self.refresh_length()
        return self._read_known(view)

    def _read_known(self, view: memoryview) -> int:
        """Read into ``view`` up to the length known now (no meta call)."""
        n = min(len(view), max(0, self.length - self._pos))
        if n <= 0:
            return 0
        done = 0
        while done < n:
            step = min(n - done, MAX_IO_BATCH_BYTES)
            read = functools.partial(
                read_spans,
                self._fs.storage,
                self.layout,
                offset=self._pos + done,
                length=step,
                path=self.name,
                into=view[done : done + step],
            )
            self._with_capability(read)
            done += step
        self._pos += n
        return n

    def readall(self) -> bytes:
        """To the end of the file: the length known here first, then one Stat for growth since, and so on."""
        self._check_open()
        if not self._om.readable:
            raise io.UnsupportedOperation("not readable")
        out = bytearray()
        while True:
            while self._pos < self.length:
                chunk = bytearray(min(self.length - self._pos, MAX_IO_BATCH_BYTES))
                out += chunk[: self._read_known(memoryview(chunk))]
            if self.refresh_length() <= self._pos:
                return bytes(out)

    def refresh_length(self) -> int:
        """The file's length now: meta's or what writers of this client wrote, whichever is larger. Cheap (one Stat).

        Meta's is a Stat by inode: what writers closed, synced or reported; this client's is what this handle or
        another writer of this client wrote.

        When meta cannot say (the file was removed and collected, or meta is away) the length known here
        stays, so a read that needed no meta before does not fail for want of it.
        """
        request = pb.StatRequest(path=pb.PathAt(parent_inode_id=self.inode_id))
        try:
            meta_length = int(self._fs.meta_call(lambda m: m.stat, request, self.name).inode.length_bytes)
        except OSError as err:
            log = logger.debug if err.errno == errno.ENOENT else logger.warning
            log("%s: length not refreshed (%s); reading to the length known here", self.name, err)
            meta_length = self.length
        self.length = max(meta_length, self.written, self._fs.local_length(self.inode_id))
        return self.length

    def write(self, b: Any) -> int:
        """Writes ``b`` at the position (at the end, in append mode) straight to storage; the bytes written.

        Fewer than ``len(b)`` where a quota ends, as a write to a full disk.

        Raises:
            OSError: EBADF once the write session was lost, EDQUOT when a quota leaves no room at all, EIO (or
                the errno storage gave) when storage refused it.
        """
        data = self._to_write(b)
        if not len(data):
            return 0
        with self._lock:
            if self._om.append:
                self._append(data)
                return len(data)
            n = self._room(self._pos, len(data))  # short where a quota ends, as a write to a full disk
            self._write_at(self._pos, data[:n])
            return n

    def append(self, b: Any) -> int:
        """Writes ``b`` at the file's end as O_APPEND does across clients (``_append``), whatever the mode.

        Returns the offset it landed at. The mount's handles opened with O_APPEND write so: the kernel puts an append at
        the end it knows, which another client may have moved since.

        Raises:
            OSError: as ``write``.
        """
        data = self._to_write(b)
        with self._lock:
            return self._append(data)

    def _to_write(self, b: Any) -> memoryview:
        """``b``'s bytes, once this file may be written (open, writable, its write session not lost)."""
        self._check_open()
        if not self._om.writable:
            raise io.UnsupportedOperation("not writable")
        if self.lost:
            raise OSError(errno.EBADF, "the write session was lost (lease expired)", self.name)
        return memoryview(b).cast("B")

    def write_extents(self, extents: Sequence[tuple[int, memoryview]]) -> None:
        """Writes each (offset, bytes), not contiguous, in as few storage batches as they fit: a buffer's flush.

        Their quota was reserved as they were buffered (``ensure_room``), and is again here when the session's limit
        no longer covers them: a session meta collected and the renewal opened again starts at the file's length, and
        storage refuses a write past the limit its capability names. The position does not move. A batch holds at
        most ``MAX_CHUNK_WRITES_PER_BATCH`` writes to one chunk: a chunk's head applies them one after another.

        Raises:
            OSError: EBADF once the write session was lost, EDQUOT when the quota no longer has room for them, EIO
                (or the errno storage gave) when storage refused.
        """
        self._check_open()
        if self.lost:
            raise OSError(errno.EBADF, "the write session was lost (lease expired)", self.name)
        chunk_size = self.layout.chunk_size
        with self._lock:
            if extents:
                self.ensure_room(max(at + len(piece) for at, piece in extents))
            batch: list[tuple[int, memoryview]] = []
            size = 0
            per_chunk: Counter[int] = Counter()
            for at, piece in extents:
                if len(piece) > MAX_IO_BATCH_BYTES:  # alone, in batches of its own
                    self._write_at(at, piece, move=False)
                    continue
                chunks = range(at // chunk_size, (at + max(len(piece), 1) - 1) // chunk_size + 1)
                full = any(per_chunk[c] >= MAX_CHUNK_WRITES_PER_BATCH for c in chunks)
                if batch and (full or size + len(piece) > MAX_IO_BATCH_BYTES):
                    self._send_extents(batch)
                    batch, size = [], 0
                    per_chunk.clear()
                batch.append((at, piece))
                size += len(piece)
                per_chunk.update(chunks)
            if batch:
                self._send_extents(batch)

    def _send_extents(self, batch: list[tuple[int, memoryview]]) -> None:
        """One storage batch of (offset, bytes) writes."""
        first, rest = batch[0], batch[1:]
        self._with_capability(lambda cap: write_spans(self._fs.storage, self.layout, cap, *first, self.name, more=rest))
        self._wrote(max(at + len(piece) for at, piece in batch))

    def _wrote(self, end: int) -> None:
        self.written = max(self.written, end)
        self.length = max(self.length, end)
        self._last_write_ns = time.time_ns()

    def _write_at(self, offset: int, data: memoryview, *, move: bool = True) -> int:
        """Write ``data`` at ``offset`` (its quota reserved by the caller); the position moves to its end."""
        end = offset + len(data)
        done = 0
        while done < len(data):
            step = min(len(data) - done, MAX_IO_BATCH_BYTES)
            write = functools.partial(
                write_spans,
                self._fs.storage,
                self.layout,
                offset=offset + done,
                data=data[done : done + step],
                path=self.name,
            )
            self._with_capability(write)
            done += step
        if move:
            self._pos = end
        self._wrote(end)
        return end

    def _append(self, data: memoryview) -> int:
        """O_APPEND across clients: take the inode's append lease, write at the end meta knows, close it at the new end.

        The lease is a write session with a well-known id, which meta gives one client at a time; closing it with the
        new end makes the next holder start after it. A dead holder's lease lapses and meta collects it. Returns the
        offset the bytes landed at.
        """
        with self._fs.append_guard(self.inode_id):
            lease, start = self.open_append_lease()
            end = start
            try:
                self.ensure_room(start + len(data))  # an append lands whole or not at all
                end = self._write_at(start, data)
            finally:
                self.close_append_lease(lease, end, wrote=end > start)
        return start

    def open_append_lease(self) -> tuple[pb.WriteSession, int]:
        """Take the inode's append lease (waiting while another client holds it): (the lease, where appends start).

        Appends start at the end meta knows (it has this client's earlier appends: each lease closed with its end),
        or further if a writer of this client wrote further without reporting it yet. Until ``close_append_lease``
        no other client appends to the file; one thread of this client at a time holds it (the caller sees to that).
        """
        lease, end_now = self._take_append_lease()
        return lease, max(end_now, self.client_length())

    def client_length(self) -> int:
        """The furthest any open writer of this client (this file included) wrote into the file, reported or not."""
        return self._fs.local_length(self.inode_id)

    def close_append_lease(self, lease: pb.WriteSession, end: int, *, wrote: bool) -> None:
        """Give the append lease back with the file's new end (what was appended under it is in storage by now)."""
        req = pb.CloseRequest(inode_id=self.inode_id, session_id=lease.session_id, written_length_bytes=end)
        if wrote and self._last_write_ns is not None:
            req.mtime_ns = self._last_write_ns
        self._fs.close_session(req, self.name)

    def _take_append_lease(self) -> tuple[pb.WriteSession, int]:
        """Open the inode's append lease, waiting while another client holds it; (session, meta's length)."""
        lease_id = f"{APPEND_LEASE_PREFIX}{self.inode_id}"
        request = pb.OpenRequest(
            path=pb.PathAt(parent_inode_id=self.inode_id),
            open_mode=pb.OPEN_MODE_WRITE,
            session_id=lease_id,
            client_id=self._fs.client_id,
        )
        deadline = time.monotonic() + APPEND_WAIT_S
        delay = 0.002
        while True:
            try:
                resp = self._fs.meta_call(lambda m: m.open, request, self.name)
                return resp.session, int(resp.inode.length_bytes)
            except OSError as err:
                if err.errno != errno.EBADF:
                    raise
                if time.monotonic() + delay > deadline:
                    raise OSError(
                        errno.EAGAIN, f"another client held the append lease for {APPEND_WAIT_S:.0f} s", self.name
                    ) from None
            time.sleep(delay)  # another client is appending: it holds the lease for one write
            delay = min(delay * 2, 0.05)

    def ensure_room(self, end: int) -> None:
        """Reserve quota up to ``end`` unless the session's limit covers it: all of it, or EDQUOT.

        EFBIG when ``end`` is past ``max_bytes``.
        """
        self._check_end(end)
        if end > self._limit and self._reserve(end) < end:
            raise self._quota_error()

    def _room(self, offset: int, size: int) -> int:
        """How many of ``size`` bytes at ``offset`` the quotas let this session write, reserved.

        All, or as many as fit before the quota ends; EDQUOT when not one does (EFBIG past ``max_bytes``).
        """
        self._check_end(offset + size)
        if offset + size > self._limit:
            self._reserve(offset + size)
        n = min(size, self._limit - offset)
        if n <= 0:
            raise self._quota_error()
        return n

    def _check_end(self, end: int) -> None:
        """EFBIG for bytes past the largest file: refused now, not by storage or meta when they are flushed."""
        if end > self.max_bytes:
            raise OSError(errno.EFBIG, f"file too large: {end} bytes, past {self.max_bytes}", self.name)

    def _quota_error(self) -> OSError:
        return OSError(errno.EDQUOT, f"directory quota exhausted at byte {self._limit}", self.name)

    def truncate(self, size: int | None = None) -> int:
        """Cuts or extends (a hole) the file to ``size`` (default: the position) in meta; returns the new size.

        Raises:
            OSError: EINVAL for a negative size, EDQUOT when growing it goes over a quota.
        """
        self._check_open()
        if not self._om.writable:
            raise io.UnsupportedOperation("not writable")
        size = self._pos if size is None else size
        if size < 0:
            raise OSError(errno.EINVAL, "negative size", self.name)
        self.ensure_room(size)
        if self._session is not None and self.written > self.meta_length:
            # meta cuts storage's chunks only below the length it knows: bytes written here since it last heard
            # would stay in storage past the new end, and come back with a later write past it or the Close
            self.fsync()
        sid = self._session.session_id if self._session is not None else ""
        # by inode, under its write session: the file it opened wherever it is now (a rename moved its name, maybe to
        # another file), and allowed by the session as its writes are, whatever its mode says now (POSIX ftruncate)
        inode = self._fs.meta_call(
            lambda m: m.truncate,
            pb.TruncateRequest(path=pb.PathAt(parent_inode_id=self.inode_id), length_bytes=size, session_id=sid),
            self.name,
        )
        self.length = self.meta_length = inode.inode.length_bytes
        self.written = min(self.written, size)
        return size

    def fsync(self) -> None:
        """Make the file's length exact on meta (and its mtime the time of the last write)."""
        self._check_open()
        req = pb.SyncRequest(
            inode_id=self.inode_id,
            written_length_bytes=self.written,
            session_id=self._session.session_id if self._session is not None else "",
        )
        if self._last_write_ns is not None:
            req.mtime_ns = self._last_write_ns
        resp = self._fs.meta_call(lambda m: m.sync, req, self.name)
        self.length = max(self.length, resp.inode.length_bytes)
        self.meta_length = resp.inode.length_bytes
        self.inode_at_sync = resp.inode  # meta's answer (the mount keeps its attributes)

    def length_covered(self) -> bool:
        """Whether the length meta last gave this file object covers every byte this session wrote.

        Then a Sync would change only the mtime, and fdatasync (and close-to-open) need none. The bytes themselves are
        durable once storage acknowledged their write (every replica of the chain); a client crashing before its Close
        leaves its session to lapse, and meta makes the length exact from storage when it collects it.
        """
        return self.written <= self.meta_length

    def close(self) -> None:
        """Closes the write session with the bytes written and the last write's time, so meta's length is exact."""
        if self.closed:
            return
        try:
            if self._session is not None:
                req = pb.CloseRequest(
                    inode_id=self.inode_id, session_id=self._session.session_id, written_length_bytes=self.written
                )
                if self._last_write_ns is not None:
                    req.mtime_ns = self._last_write_ns
                self._fs.close_session(req, self.name)
        finally:
            super().close()

    # ---- internals ----

    @property
    def session(self) -> pb.WriteSession | None:
        """The file's write session (meta's id, limit and lease); None for a file opened to read."""
        return self._session

    def session_renewed(self, session: pb.WriteSession) -> None:
        """Meta opened the session again (after collecting it): writes go on under its new limit."""
        self._session = session
        self._limit = session.write_limit_bytes

    def report(self) -> pb.SessionReport | None:
        """What the lease renewal tells meta of this session (bytes written so far); None without a session."""
        if self._session is None:
            return None
        return pb.SessionReport(
            session_id=self._session.session_id, inode_id=self.inode_id, written_length_bytes=self.written
        )

    def _reserve(self, end: int) -> int:
        """Raise the session's write limit toward ``end``; returns the new limit.

        A step past it when the quotas allow, else as much of it as they allow (meta's partial grant, possibly less
        than ``end``).

        Raises:
            OSError: EDQUOT when not one more byte may be written.
        """
        assert self._session is not None
        step = max(end, min(self._limit, 1 << 62) + RESERVE_STEP_BYTES)
        try:
            self._limit = self._ask_reserve(step, partial=False)
        except OSError as exc:
            if exc.errno != errno.EDQUOT:
                raise
            self._limit = self._ask_reserve(end, partial=True)
        return self._limit

    def _ask_reserve(self, want: int, partial: bool) -> int:
        assert self._session is not None
        request = pb.ReserveSpaceRequest(
            inode_id=self.inode_id, session_id=self._session.session_id, write_limit_bytes=want, partial=partial
        )
        resp = self._fs.meta_call(lambda m: m.reserve_space, request, self.name)
        if resp.HasField("io_capability"):  # storage takes writes only below the limit the capability names
            self.take_capability(resp.io_capability.token, resp.io_capability.expires_at_ns)
        return int(resp.write_limit_bytes)

    def _with_capability(self, call: Callable[[bytes], Coroutine[Any, Any, T]]) -> T:
        """Run the storage call ``call(capability)`` with a fresh IoCapability; refused, with a new one once more.

        Storage refuses a capability its clock says expired: this client's clock may be behind meta's (or storage's
        ahead of it) by more than the refresh margin. A node refuses a whole batch before it writes any of it, and
        another node's part written already is written again with the same bytes: the call goes again as it was.
        """
        self._fresh_capability()
        try:
            return self._fs.run(call(self._cap))
        except PermissionError:
            self._fresh_capability(force=True)
            return self._fs.run(call(self._cap))

    def _fresh_capability(self, *, force: bool = False) -> None:
        """Open the file again for a new IoCapability shortly before the one held expires (``force``: now).

        By inode, so a rename does not matter; a write open names this session, which meta then just returns. When
        meta does not answer (a restart) while the one held is still good by this client's clock, it is kept and the
        refresh tried again ``CAPABILITY_RETRY_NS`` later.
        """
        now = time.time_ns()
        if not force and (not self.cap_expires_at_ns or now < self.cap_expires_at_ns - self._cap_margin_ns):
            return
        if not force and time.monotonic_ns() < self._cap_retry_at_ns:
            return
        request = pb.OpenRequest(path=pb.PathAt(parent_inode_id=self.inode_id), open_mode=pb.OPEN_MODE_READ)
        if self._session is not None:
            request.open_mode = pb.OPEN_MODE_WRITE
            request.session_id, request.client_id = self._session.session_id, self._session.client_id
        try:
            resp = self._fs.meta_call(lambda m: m.open, request, self.name)
        except OSError as err:  # Hf3fsError (no meta answered) is one too
            if force or now >= self.cap_expires_at_ns:
                raise
            self._cap_retry_at_ns = time.monotonic_ns() + CAPABILITY_RETRY_NS
            logger.warning(
                "%s: IoCapability not refreshed (%s); the one held is good for %.0f s more",
                self.name,
                err,
                (self.cap_expires_at_ns - now) / 1e9,
            )
            return
        self.take_capability(resp.io_capability.token, resp.io_capability.expires_at_ns)

    def take_capability(self, token: bytes, expires_at_ns: int) -> None:
        """The IoCapability to use from now on.

        Refreshed ``CAPABILITY_MARGIN_NS`` before it expires, or a quarter of its lifetime ahead for a short-lived one
        (meta gives writable capabilities minutes: its ``writable_capability_ttl_s``); ``cap_expires_at_ns`` 0 where
        this client's clock cannot tell.
        """
        left_ns = expires_at_ns - time.time_ns()
        # A fresh one already expired by this client's clock: the clock is ahead of meta's by more than the lifetime and
        # cannot tell when it expires (each IO would open the file again); storage's refusal says (_with_capability).
        self._cap, self.cap_expires_at_ns = token, expires_at_ns if left_ns > 0 else 0
        self._cap_margin_ns = min(CAPABILITY_MARGIN_NS, max(0, left_ns) // 4)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")


def _sync(f: Any) -> None:
    f.flush()
    f.raw.fsync()


def _room_for(f: Any, b: Any) -> None:
    """Reserve quota for a buffered write when it is buffered, so EDQUOT comes from this ``write``.

    Rather than from the flush at close (one ReserveSpace per 64 MiB; nothing when no quota applies).
    """
    f.raw.ensure_room(f.tell() + memoryview(b).nbytes)


class BufferedReader(io.BufferedReader):
    """A file opened to read (``"rb"``), as ``io`` buffers it, with ``fsync``."""

    def fsync(self) -> None:
        """Makes the file's length exact on meta, as ``os.fsync`` on a local file."""
        _sync(self)


class BufferedWriter(io.BufferedWriter):
    """A file opened to write (``"wb"``, ``"ab"``, ``"xb"``): buffered writes whose quota is reserved as they come."""

    def write(self, b: Any) -> int:
        """Buffers ``b``; EDQUOT here, not at the flush, when a quota leaves no room for it."""
        _room_for(self, b)
        return super().write(b)

    def fsync(self) -> None:
        """Flushes the buffer, then makes the file's length exact on meta."""
        _sync(self)


class BufferedRandom(io.BufferedRandom):
    """A file opened to read and write (``"r+b"``, ``"w+b"``...): as BufferedWriter, reading too."""

    def write(self, b: Any) -> int:
        """Buffers ``b``; EDQUOT here, not at the flush, when a quota leaves no room for it."""
        _room_for(self, b)
        return super().write(b)

    def fsync(self) -> None:
        """Flushes the buffer, then makes the file's length exact on meta."""
        _sync(self)


class TextFile(io.TextIOWrapper):
    """A file opened in text mode: a TextIOWrapper over the buffered file, with ``fsync``."""

    def fsync(self) -> None:
        """Flushes the text and the buffer, then makes the file's length exact on meta."""
        self.flush()
        fsync: Callable[[], None] = getattr(self.buffer, "fsync")  # noqa: B009
        fsync()


def wrap(
    raw: RawFile, om: OpenMode, buffering: int, encoding: str | None, errors: str | None, newline: str | None
) -> Any:
    """The file object ``open()`` returns for ``raw``: unbuffered, buffered, or text, as ``buffering`` and the mode say.

    Buffers are one chunk by default.

    Raises:
        ValueError: unbuffered text.
    """
    if buffering == 0:
        if not om.binary:
            raise ValueError("can't have unbuffered text I/O")
        return raw
    size = buffering if buffering > 1 else raw.layout.chunk_size
    if om.readable and om.writable:
        buffered: Any = BufferedRandom(raw, size)
    elif om.writable:
        buffered = BufferedWriter(raw, size)
    else:
        buffered = BufferedReader(raw, size)
    if om.binary:
        return buffered
    return TextFile(
        buffered, encoding=encoding or "utf-8", errors=errors, newline=newline, line_buffering=buffering == 1
    )


def session_lost(raw: RawFile) -> None:
    """Marks ``raw``'s write session lost (meta collected it): its later writes fail with EBADF."""
    raw.lost = True
