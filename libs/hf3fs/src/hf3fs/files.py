"""File objects of hf3fs: a RawIOBase whose reads and writes go straight to storage (whole-chunk batches
through the file's layout), wrapped in io's buffered classes and, for text modes, a TextIOWrapper."""

from __future__ import annotations

import errno
import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.storage.v1 import storage_pb2 as spb
from hf3fs.layout import FileLayout
from hf3fs.meta_client import Hf3fsError
from hf3fs.storage_client import ChunkRead, ChunkWrite, StorageClient, StorageIoError

if TYPE_CHECKING:
    from hf3fs.fs import FileSystem

MAX_IO_BATCH_BYTES = 32 << 20
NO_LIMIT = (1 << 64) - 1
RESERVE_STEP_BYTES = 64 << 20
CAPABILITY_MARGIN_NS = 60 * 10**9


@dataclass(frozen=True)
class OpenMode:
    readable: bool
    writable: bool
    append: bool
    create: bool
    exclusive: bool
    truncate: bool
    binary: bool

    @classmethod
    def parse(cls, mode: str) -> OpenMode:
        chars = set(mode)
        kinds = chars & set("rwax")
        if len(kinds) != 1 or len(mode) != len(chars) or chars - set("rwaxbt+") or {"b", "t"} <= chars:
            raise ValueError(f"invalid mode: {mode!r}")
        kind = kinds.pop()
        plus = "+" in chars
        return cls(
            readable=kind == "r" or plus, writable=kind != "r" or plus, append=kind == "a",
            create=kind in "wax", exclusive=kind == "x", truncate=kind == "w", binary="b" in chars,
        )  # fmt: skip


def io_error(message: str, path: str, code: int = errno.EIO) -> OSError:
    return OSError(code, message, path)


async def read_spans(storage: StorageClient, layout: FileLayout, cap: bytes, offset: int, length: int,
                     path: str) -> bytearray:  # fmt: skip
    """Bytes ``[offset, offset + length)`` of a file from storage; holes and short chunks read as zeros."""
    out = bytearray(length)
    spans = layout.spans(offset, length)
    ios = [ChunkRead(chain_id=s.chain_id, inode_id=layout.inode_id, chunk_index=s.chunk_index, offset=s.offset,
                     length=s.length, capability=cap) for s in spans]  # fmt: skip
    try:
        outcomes = await storage.batch_read(ios)
    except StorageIoError as err:
        raise io_error(f"read refused by storage: {err}", path, _errno_of(err)) from None
    for s, o in zip(spans, outcomes, strict=True):
        if o.ok:
            pos = s.file_offset - offset
            out[pos : pos + len(o.data)] = o.data
        elif o.status != spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND:
            raise io_error(f"read of chunk {s.chunk_index} failed: {o.message or o.status}", path)
    return out


async def write_spans(storage: StorageClient, layout: FileLayout, cap: bytes, offset: int, data: memoryview,
                      path: str) -> None:  # fmt: skip
    spans = layout.spans(offset, len(data))
    ios = [ChunkWrite(chain_id=s.chain_id, inode_id=layout.inode_id, chunk_index=s.chunk_index, offset=s.offset,
                      data=data[s.file_offset - offset : s.file_offset - offset + s.length],
                      chunk_size=layout.chunk_size, capability=cap) for s in spans]  # fmt: skip
    try:
        outcomes = await storage.batch_write(ios)
    except StorageIoError as err:
        raise io_error(f"write refused by storage: {err}", path, _errno_of(err)) from None
    for s, o in zip(spans, outcomes, strict=True):
        if not o.ok:
            code = errno.ENOSPC if o.status == spb.CHUNK_IO_STATUS_NO_SPACE else errno.EIO
            raise io_error(f"write of chunk {s.chunk_index} failed: {o.message or o.status}", path, code)


def _errno_of(err: StorageIoError) -> int:
    name = err.code.name if err.code is not None else ""
    return errno.EACCES if name in ("PERMISSION_DENIED", "UNAUTHENTICATED") else errno.EIO


def layout_of(inode: pb.Inode, table: list[int]) -> FileLayout:
    from hf3fs.layout import file_chains

    lay = inode.layout
    chains = file_chains(table, lay.chain_begin_index, lay.stripe_size, lay.shuffle_seed)
    return FileLayout(inode.inode_id, lay.chunk_size_bytes, tuple(chains))


class RawFile(io.RawIOBase):
    """One open hf3fs file. Not for direct use: ``FileSystem.open`` wraps it in buffered/text layers."""

    def __init__(self, fs: FileSystem, path: str, mode: str, om: OpenMode, inode: pb.Inode, layout: FileLayout,
                 capability: bytes, session: pb.WriteSession | None) -> None:  # fmt: skip
        super().__init__()
        self._fs = fs
        self.name = path
        self.mode = mode
        self._om = om
        self.inode_id = inode.inode_id
        self.layout = layout
        self._cap = capability
        self.cap_expires_at_ns = 0  # 0: unknown (never refreshed ahead of time)
        self._session = session
        self._limit = session.write_limit_bytes if session is not None else NO_LIMIT
        self.length = inode.length_bytes
        self.written = 0  # highest offset written by this session
        self._last_write_ns: int | None = None
        self._pos = 0
        self._lock = threading.Lock()
        self.lost = False

    # ---- io.RawIOBase ----

    def readable(self) -> bool:
        return self._om.readable

    def writable(self) -> bool:
        return self._om.writable

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        self._check_open()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_open()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.length + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(errno.EINVAL, "negative seek position", self.name)
        self._pos = pos
        return pos

    def readinto(self, buffer: Any) -> int:
        self._check_open()
        if not self._om.readable:
            raise io.UnsupportedOperation("not readable")
        view = memoryview(buffer).cast("B")
        n = min(len(view), max(0, self.length - self._pos))
        if n <= 0:
            return 0
        done = 0
        while done < n:
            step = min(n - done, MAX_IO_BATCH_BYTES)
            self._fresh_capability()
            data = self._fs._run(read_spans(self._fs._storage, self.layout, self._cap, self._pos + done, step,
                                            self.name))  # fmt: skip
            view[done : done + step] = data
            done += step
        self._pos += n
        return n

    def readall(self) -> bytes:
        out = bytearray()
        while True:
            chunk = bytearray(max(self.layout.chunk_size, self.length - self._pos))
            n = self.readinto(chunk)
            if not n:
                return bytes(out)
            out += chunk[:n]

    def write(self, b: Any) -> int:
        self._check_open()
        if not self._om.writable:
            raise io.UnsupportedOperation("not writable")
        if self.lost:
            raise OSError(errno.EBADF, "the write session was lost (lease expired)", self.name)
        data = memoryview(b).cast("B")
        if not len(data):
            return 0
        with self._lock:
            if self._om.append:
                self._pos = self.length
            end = self._pos + len(data)
            if end > self._limit:
                self._reserve(end)
            done = 0
            while done < len(data):
                step = min(len(data) - done, MAX_IO_BATCH_BYTES)
                self._fresh_capability()
                self._fs._run(write_spans(self._fs._storage, self.layout, self._cap, self._pos + done,
                                          data[done : done + step], self.name))  # fmt: skip
                done += step
            self._pos = end
            self.written = max(self.written, end)
            self.length = max(self.length, end)
            self._last_write_ns = time.time_ns()
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        self._check_open()
        if not self._om.writable:
            raise io.UnsupportedOperation("not writable")
        size = self._pos if size is None else size
        if size < 0:
            raise OSError(errno.EINVAL, "negative size", self.name)
        if size > self._limit:
            self._reserve(size)
        sid = self._session.session_id if self._session is not None else ""
        inode = self._fs._meta_call(lambda s: s.Truncate, pb.TruncateRequest(
            path=pb.PathAt(path=self.name), length_bytes=size, session_id=sid), self.name)  # fmt: skip
        self.length = inode.inode.length_bytes
        self.written = min(self.written, size)
        return size

    def fsync(self) -> None:
        """Make the file's length exact on meta (and its mtime the time of the last write)."""
        self._check_open()
        req = pb.SyncRequest(inode_id=self.inode_id, written_length_bytes=self.written,
                             session_id=self._session.session_id if self._session is not None else "")  # fmt: skip
        if self._last_write_ns is not None:
            req.mtime_ns = self._last_write_ns
        resp = self._fs._meta_call(lambda s: s.Sync, req, self.name)
        self.length = max(self.length, resp.inode.length_bytes)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._session is not None:
                req = pb.CloseRequest(inode_id=self.inode_id, session_id=self._session.session_id,
                                      written_length_bytes=self.written)  # fmt: skip
                if self._last_write_ns is not None:
                    req.mtime_ns = self._last_write_ns
                self._fs._forget_writer(self._session.session_id)
                self._fs._meta_call(lambda s: s.Close, req, self.name)
        finally:
            super().close()

    # ---- internals ----

    @property
    def session(self) -> pb.WriteSession | None:
        return self._session

    def session_renewed(self, session: pb.WriteSession) -> None:
        """Meta opened the session again (after collecting it): writes go on under its new limit."""
        self._session = session
        self._limit = session.write_limit_bytes

    def report(self) -> pb.SessionReport | None:
        if self._session is None:
            return None
        return pb.SessionReport(session_id=self._session.session_id, inode_id=self.inode_id,
                                written_length_bytes=self.written)  # fmt: skip

    def _reserve(self, end: int) -> None:
        """Raise the session's write limit to cover ``end`` (a step more when the quota allows)."""
        assert self._session is not None
        sid = self._session.session_id
        err: OSError | None = None
        for want in (max(end, min(self._limit, 1 << 62) + RESERVE_STEP_BYTES), end):
            try:
                resp = self._fs._meta_call(lambda s, w=want: s.ReserveSpace, pb.ReserveSpaceRequest(  # type: ignore[misc]
                    inode_id=self.inode_id, session_id=sid, write_limit_bytes=want), self.name)  # fmt: skip
            except OSError as exc:
                if exc.errno != errno.EDQUOT:
                    raise
                err = exc
                continue
            self._limit = resp.write_limit_bytes
            return
        assert err is not None
        raise err

    def _fresh_capability(self) -> None:
        """Open the file again (by inode, so a rename does not matter) for a new IoCapability shortly before
        the one held expires; a write open names this session, which meta then just returns."""
        if not self.cap_expires_at_ns or time.time_ns() < self.cap_expires_at_ns - CAPABILITY_MARGIN_NS:
            return
        request = pb.OpenRequest(path=pb.PathAt(parent_inode_id=self.inode_id), open_mode=pb.OPEN_MODE_READ)
        if self._session is not None:
            request.open_mode = pb.OPEN_MODE_WRITE
            request.session_id, request.client_id = self._session.session_id, self._session.client_id
        resp = self._fs._meta_call(lambda s: s.Open, request, self.name)
        self._cap = resp.io_capability.token
        self.cap_expires_at_ns = resp.io_capability.expires_at_ns

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")


def _sync(f: Any) -> None:
    f.flush()
    f.raw.fsync()


class BufferedReader(io.BufferedReader):
    def fsync(self) -> None:
        _sync(self)


class BufferedWriter(io.BufferedWriter):
    def fsync(self) -> None:
        _sync(self)


class BufferedRandom(io.BufferedRandom):
    def fsync(self) -> None:
        _sync(self)


class TextFile(io.TextIOWrapper):
    def fsync(self) -> None:
        self.flush()
        fsync: Callable[[], None] = getattr(self.buffer, "fsync")  # noqa: B009
        fsync()


def wrap(raw: RawFile, om: OpenMode, buffering: int, encoding: str | None, errors: str | None,
         newline: str | None) -> Any:  # fmt: skip
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
    return TextFile(buffered, encoding=encoding or "utf-8", errors=errors, newline=newline,
                    line_buffering=buffering == 1)  # fmt: skip


def session_lost(raw: RawFile) -> None:
    raw.lost = True


_ = Hf3fsError
