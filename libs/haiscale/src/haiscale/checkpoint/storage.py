"""Where checkpoint bytes go: a 3FS folder through the hf3fs client's batch API, or a POSIX folder.

A POSIX folder is on a local disk or a 3FS FUSE mount, which is POSIX too.

A checkpoint path written ``hf3fs:///a/b`` (or ``hf3fs:/a/b``, ``3fs:/a/b``) is in 3FS and is written with
``FileSystem.write_batch`` in batches of at most ``BATCH_BYTES``; any other path is a folder of this machine.
"""

from __future__ import annotations

import os
import stat
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy

from hf3fs.uri import has_scheme, strip_scheme

Bytes = bytes | bytearray | memoryview  # what a read gives: a buffer of the bytes asked for
PIECE_BYTES = 32 << 20  # one (path, offset, data) of a batch: what the client's file writes send at a time
BATCH_BYTES = 256 << 20  # bytes per batch call (its pieces go concurrently): one write session per call
# bytes per read call: calls of 16-32 MiB one after another read faster than one large batch (a node answers
# it in few large calls, its disk reads not overlapping the transfer) and than 4 MiB calls (a meta BatchStat
# each); measured in bench/results/checkpoint.md
READ_CALL_BYTES = 32 << 20
STAT_BATCH = 1000  # paths per meta BatchStat (meta takes up to 10000)
READ_SMALL_PIECE_BYTES = 8 << 20  # a manifest is read in pieces of this size

Piece = tuple[int, memoryview]  # (offset in the file, bytes)
Range = tuple[str, int, int]  # (path, offset, length) of a read


class Storage(Protocol):
    """The file operations a checkpoint needs; paths are this storage's own (absolute)."""

    def makedirs(self, path: str) -> None:
        """Create folder ``path`` and its missing parents; one that exists already is fine."""

    def exists(self, path: str) -> bool:
        """Whether a file or folder is at ``path`` that this user may see (False where it may not look)."""

    def listdir(self, path: str) -> list[str]:
        """The names in folder ``path``; an empty list when there is no such folder."""

    def write_file(self, path: str, pieces: Sequence[Piece]) -> None:
        """Create (or truncate) ``path`` and write each ``(offset, bytes)`` piece; the bytes are durable on return."""

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` at once: a reader sees the old file or the new one, never part of one."""

    def read_ranges(self, ranges: Sequence[Range]) -> list[Bytes]:
        """The bytes of each ``(path, offset, length)``, in order; a range past the end of its file comes back short."""

    def read_into(self, ranges: Sequence[Range], buffers: Sequence[memoryview]) -> list[int]:
        """Read each ``(path, offset, length)`` into its writable buffer (``length`` bytes); the bytes each got.

        Fewer than ``length`` where a file ends.
        """

    def read_small(self, path: str, limit_bytes: int) -> bytes:
        """The whole file at ``path`` (a manifest or a part of one: small files), at most ``limit_bytes``.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a regular file (a FIFO, a device), or longer than ``limit_bytes`` (read no further).
        """

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        """The size in bytes of each regular file of ``paths``; None for one that is missing or not a file."""

    def remove(self, path: str) -> None:
        """Remove the file at ``path``."""

    def rename(self, src: str, dst: str) -> None:
        """Rename file ``src`` to ``dst`` (replacing it) at once (FileNotFoundError if ``src`` is not there)."""

    def remove_tree(self, path: str) -> None:
        """Remove folder ``path`` and everything in it; nothing happens if it is not there."""


def split_batches(
    pieces: Sequence[Piece], limit: int = BATCH_BYTES, piece_limit: int = PIECE_BYTES
) -> Iterator[list[Piece]]:
    """The pieces cut to at most ``piece_limit`` bytes each and grouped into batches of at most ``limit`` bytes.

    Few large pieces write faster than many small ones: each piece of a batch is its own concurrent write.
    """
    batch: list[Piece] = []
    size = 0
    for offset, data in pieces:
        for start in range(0, max(len(data), 1), piece_limit):
            part = data[start : start + piece_limit]
            if size + len(part) > limit and batch:
                yield batch
                batch, size = [], 0
            batch.append((offset + start, part))
            size += len(part)
    if batch:
        yield batch


T = TypeVar("T")


def _runs(items: Sequence[T], size: Callable[[T], int], limit: int) -> Iterator[list[T]]:
    """``items`` in order, in runs of at most ``limit`` bytes (an item larger than that is a run of its own)."""
    run: list[T] = []
    total = 0
    for item in items:
        if run and total + size(item) > limit:
            yield run
            run, total = [], 0
        run.append(item)
        total += size(item)
    if run:
        yield run


class LocalStorage:
    """A POSIX folder: ``pwrite`` + ``fsync``, renames made durable by an ``fsync`` of the folder."""

    def makedirs(self, path: str) -> None:
        """``Storage.makedirs`` with ``os.makedirs``."""
        os.makedirs(path, exist_ok=True)

    def exists(self, path: str) -> bool:
        """``Storage.exists`` (follows symlinks: a dangling one does not exist)."""
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        """``Storage.listdir``, in the order the file system lists them."""
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def write_file(self, path: str, pieces: Sequence[Piece]) -> None:
        """``Storage.write_file``: ``pwrite`` every piece, then ``fsync`` the file."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for offset, data in pieces:
                done = 0
                while done < len(data):
                    done += os.pwrite(fd, data[done:], offset + done)
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_atomic(self, path: str, data: bytes) -> None:
        """``Storage.write_atomic``: a temporary file renamed over ``path``, then an ``fsync`` of the folder.

        The folder's fsync makes the rename itself survive a crash.
        """
        tmp = _temporary_name(path)
        self.write_file(tmp, [(0, memoryview(data))])
        os.rename(tmp, path)
        _fsync_dir(os.path.dirname(path))

    def read_ranges(self, ranges: Sequence[Range]) -> list[Bytes]:
        """``Storage.read_ranges``: ``read_into`` new buffers."""
        return _read_new(self, ranges)

    def read_into(self, ranges: Sequence[Range], buffers: Sequence[memoryview]) -> list[int]:
        """``Storage.read_into`` with ``preadv`` straight into the buffers.

        One file open at a time, each opened once when the ranges come file by file (the loader sorts them): a load
        of a checkpoint saved on thousands of ranks opened every rank's file at once, past the limit of open files
        (1024 by default: EMFILE).
        """
        got = []
        fd, current = -1, ""
        try:
            for (path, offset, length), buffer in zip(ranges, buffers, strict=True):
                if path != current:
                    if fd >= 0:
                        os.close(fd)
                        fd = -1  # (if the next open fails, nothing is left to close)
                    fd, current = os.open(path, os.O_RDONLY), path
                got.append(_pread_into(fd, offset, buffer[:length]))
            return got
        finally:
            if fd >= 0:
                os.close(fd)

    def read_small(self, path: str, limit_bytes: int) -> bytes:
        """``Storage.read_small``: the type checked on the open file, so nothing swapped in after a look passes.

        Opened without blocking: opening a FIFO for reading would wait for a writer forever.
        """
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{path}: not a regular file")
            return _read_bounded(path, f, limit_bytes)

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        """``Storage.sizes``: one ``os.stat`` each (symlinks followed)."""
        out: list[int | None] = []
        for path in paths:
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                out.append(None)
                continue
            out.append(st.st_size if stat.S_ISREG(st.st_mode) else None)
        return out

    def remove(self, path: str) -> None:
        """``Storage.remove`` (FileNotFoundError if there is no such file)."""
        os.remove(path)

    def rename(self, src: str, dst: str) -> None:
        """``Storage.rename``: ``os.rename``, then an ``fsync`` of the folder."""
        os.rename(src, dst)
        _fsync_dir(os.path.dirname(dst))

    def remove_tree(self, path: str) -> None:
        """``Storage.remove_tree``; errors are ignored, so a file that cannot be removed stays."""
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def _temporary_name(path: str) -> str:
    """A name beside ``path`` no other writer uses: pids and thread ids repeat across hosts and containers."""
    return f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex}"


def _read_bounded(path: str, f: Any, limit_bytes: int) -> bytes:
    """The rest of file ``f``, read in pieces of ``READ_SMALL_PIECE_BYTES``; ValueError past ``limit_bytes``.

    In pieces: ``read(limit_bytes + 1)`` would allocate the whole limit (a gigabyte) for every manifest read.
    """
    pieces: list[bytes] = []
    total = 0
    while piece := bytes(f.read(min(READ_SMALL_PIECE_BYTES, limit_bytes + 1 - total))):
        pieces.append(piece)
        total += len(piece)
        if total > limit_bytes:
            raise ValueError(f"{path}: more than {limit_bytes} bytes, more than a manifest may be")
    return b"".join(pieces)


def _pread_into(fd: int, offset: int, view: memoryview) -> int:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if not n:
            break
        done += n
    return done


def _read_new(storage: Storage, ranges: Sequence[Range]) -> list[Bytes]:
    """Each range read into a new buffer of its own (``numpy.empty``: not zeroed, it is read over)."""
    buffers = [numpy.empty(n, dtype=numpy.uint8).data for _, _, n in ranges]
    got = storage.read_into(ranges, buffers)
    return [b[:n] for b, n in zip(buffers, got, strict=True)]


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Hf3fsStorage:
    """A folder in 3FS through one ``hf3fs.FileSystem``: data with ``write_batch``/``read_batch``.

    A close makes a file's bytes durable (every replica acknowledged) and its length exact; a rename is one meta
    transaction.
    """

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def makedirs(self, path: str) -> None:
        """``Storage.makedirs``: one meta call."""
        self.fs.makedirs(path, exist_ok=True)

    def exists(self, path: str) -> bool:
        """``Storage.exists``: one meta stat (symlinks followed).

        False where this user may not look, as ``os.path.exists`` (a folder of someone else's in a shared root is
        no checkpoint of the caller's).
        """
        try:
            return bool(self.fs.exists(path))
        except (PermissionError, NotADirectoryError):
            return False

    def listdir(self, path: str) -> list[str]:
        """``Storage.listdir``: the meta listing, read page by page."""
        try:
            return list(self.fs.listdir(path))
        except FileNotFoundError:
            return []

    def write_file(self, path: str, pieces: Sequence[Piece]) -> None:
        """``Storage.write_file``: ``write_batch`` calls of at most ``BATCH_BYTES``, pieces of ``PIECE_BYTES``."""
        self.fs.create(path)
        for batch in split_batches(pieces):
            self.fs.write_batch([(path, offset, data) for offset, data in batch if len(data)])

    def write_atomic(self, path: str, data: bytes) -> None:
        """``Storage.write_atomic``: a temporary file, closed (durable), then renamed over ``path``."""
        tmp = _temporary_name(path)
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.rename(tmp, path)

    def read_ranges(self, ranges: Sequence[Range]) -> list[Bytes]:
        """``Storage.read_ranges``: ``read_into`` new buffers."""
        return _read_new(self, ranges)

    def read_into(self, ranges: Sequence[Range], buffers: Sequence[memoryview]) -> list[int]:
        """``Storage.read_into``: ``read_batch_into`` calls of about ``READ_CALL_BYTES`` each, one after another.

        A range larger than that is read as pieces of it (each into its slice of the buffer). The bytes land from
        the transport in the buffers, with no copy.
        """
        pieces: list[tuple[int, Range, memoryview]] = []  # (index of its range, the piece, its buffer)
        for i, ((path, offset, length), buffer) in enumerate(zip(ranges, buffers, strict=True)):
            for start in range(0, length, READ_CALL_BYTES):
                n = min(READ_CALL_BYTES, length - start)
                pieces.append((i, (path, offset + start, n), buffer[start : start + n]))
        got = [0] * len(ranges)
        for batch in _runs(pieces, lambda p: p[1][2], READ_CALL_BYTES):
            for (i, _, _), n in zip(
                batch, self.fs.read_batch_into([p[1] for p in batch], [p[2] for p in batch]), strict=True
            ):
                got[i] += n  # past a file's end its pieces read short, then nothing: the sum is what was read
        return got

    def read_small(self, path: str, limit_bytes: int) -> bytes:
        """``Storage.read_small`` through a file opened for reading (3FS has no FIFOs or devices)."""
        with self.fs.open(path, "rb") as f:
            return _read_bounded(path, f, limit_bytes)

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        """``Storage.sizes``: meta BatchStats of up to ``STAT_BATCH`` paths."""
        stats = []
        for i in range(0, len(paths), STAT_BATCH):
            stats += self.fs.batch_stat(list(paths[i : i + STAT_BATCH]))
        return [None if isinstance(s, OSError) or s.type != "file" else int(s.size) for s in stats]

    def remove(self, path: str) -> None:
        """``Storage.remove``: one meta call (FileNotFoundError if there is no such file)."""
        self.fs.remove(path)

    def rename(self, src: str, dst: str) -> None:
        """``Storage.rename``: one meta transaction."""
        self.fs.rename(src, dst)

    def remove_tree(self, path: str) -> None:
        """``Storage.remove_tree``: deleted now, not moved to the trash."""
        if self.fs.exists(path):
            self.fs.rmtree(path, trash=False)


@dataclass(frozen=True)
class Location:
    """A checkpoint root: its storage, its path there, and the URL a user wrote (for messages and reports)."""

    storage: Storage
    path: str
    in_3fs: bool

    def join(self, *names: str) -> str:
        """The path of ``names`` under the root (empty names are skipped)."""
        parts = [n for n in names if n]
        return "/".join([self.path.rstrip("/"), *parts]) if self.in_3fs else os.path.join(self.path, *parts)

    def url(self, *names: str) -> str:
        """``join``'s path as a user would write it: an ``hf3fs://`` URL in 3FS, a plain path elsewhere."""
        return f"hf3fs://{self.join(*names)}" if self.in_3fs else self.join(*names)


_connections: dict[tuple[str, str], Any] = {}
_connections_lock = threading.Lock()


def _default_fs() -> Any:
    """One ``hf3fs.FileSystem`` per process for FF_MGMTD_ADDRESSES/FF_TOKEN, made on first use."""
    import hf3fs

    key = (os.environ.get("FF_MGMTD_ADDRESSES", ""), os.environ.get("FF_TOKEN", ""))
    with _connections_lock:
        fs = _connections.get(key)
        if fs is None:
            fs = _connections[key] = hf3fs.connect()
        return fs


def locate(path: str | os.PathLike[str], fs: Any = None) -> Location:
    """The storage of a checkpoint root: 3FS for ``hf3fs://`` URLs, a POSIX folder otherwise.

    3FS goes through ``fs``, or a connection made from FF_MGMTD_ADDRESSES and FF_TOKEN (one per process); a
    relative POSIX path is made absolute.
    """
    text = os.fspath(path)
    if has_scheme(text):
        return Location(Hf3fsStorage(fs if fs is not None else _default_fs()), strip_scheme(text), True)
    return Location(LocalStorage(), os.path.abspath(text), False)
