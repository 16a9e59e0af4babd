"""The data side of a FileSystem: opening files, and batch reads and writes of many files straight to storage."""

from __future__ import annotations

import asyncio
import errno
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ff_fsprotocol.layout import FileLayout
from fireflyer.meta.v1 import meta_pb2 as pb
from hf3fs.files import OpenMode, RawFile, wrap
from hf3fs.fs.connection import Connection
from hf3fs.fs.paths import path_at
from hf3fs.fs.sessions import MetaCall, OpenFileBackend, WriteSessions
from hf3fs.meta_client import ERRNO_OF_FS_ERROR, Hf3fsError
from hf3fs.spans import read_spans, write_spans

WHOLE_FILE = 1 << 62  # a read_batch length meaning "to the end of the file"
CREATE_RETRY_INTERVAL_S = 0.2  # between attempts of a Create whose answer meta never gave


class DataPath:
    """Opens files (``RawFile`` on a write session when writable) and runs batch I/O, for one FileSystem."""

    def __init__(self, conn: Connection, sessions: WriteSessions, meta_call: MetaCall) -> None:
        self._conn = conn
        self._sessions = sessions
        self._meta_call = meta_call  # the file system's (write-back flushed first)
        self._backend = OpenFileBackend(conn, sessions, meta_call)

    def open(
        self,
        path: str,
        mode: str,
        om: OpenMode,
        *,
        buffering: int,
        perm: int,
        encoding: str | None,
        errors: str | None,
        newline: str | None,
        write_only: bool,
    ) -> Any:
        """``FileSystem.open`` of a file that is not written back: Create or Open at meta, then the file object."""
        session_id = uuid.uuid4().hex if om.writable else ""
        open_mode = (
            (pb.OPEN_MODE_READ_WRITE if om.readable and not write_only else pb.OPEN_MODE_WRITE)
            if om.writable
            else pb.OPEN_MODE_READ
        )
        client_id = self._conn.client_id
        resp: pb.CreateResponse | pb.OpenResponse
        if om.create:
            resp = self._create(
                pb.CreateRequest(
                    path=path_at(path),
                    mode=perm,
                    exclusive=om.exclusive,
                    open_mode=open_mode,
                    truncate=om.truncate,
                    session_id=session_id,
                    client_id=client_id,
                ),
                path,
            )
        else:
            resp = self._meta_call(
                lambda m: m.open,
                pb.OpenRequest(path=path_at(path), open_mode=open_mode, session_id=session_id, client_id=client_id),
                path,
            )
        inode = resp.inode
        if inode.type == pb.INODE_TYPE_DIRECTORY:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
        session = resp.session if resp.HasField("session") else None
        layout = self._conn.layout(inode)
        raw = RawFile(self._backend, path, mode, om, inode, layout, resp.io_capability.token, session)
        raw.take_capability(resp.io_capability.token, resp.io_capability.expires_at_ns)
        if session is not None:
            self._sessions.add(raw, session.session_id)
        if om.append:
            raw.seek(raw.length)  # the length Open just answered
        try:
            return wrap(raw, om, buffering, encoding, errors, newline)
        except BaseException:
            raw.close()
            raise

    def _create(self, request: pb.CreateRequest, path: str) -> pb.CreateResponse:
        """Create at meta. One that opens a write session is sent again while meta's answer is unknown.

        For up to ``close_retry_s``, as a Close. A Create is not idempotent, and meta may have applied one whose
        answer was lost (it died, the connection broke): its session would then be renewed with this client's
        others and never end, holding the file (GC waits for it) and its quota reservation. Sent again under the
        same session id it is idempotent: meta answers a Create whose file already holds that session (O_EXCL too)
        as the first time.

        Raises:
            Hf3fsError: meta did not answer within ``close_retry_s``.
            OSError: meta refused the Create.
        """
        deadline = time.monotonic() + self._conn.close_retry_s
        while True:
            try:
                return self._meta_call(lambda m: m.create, request, path)
            except Hf3fsError:
                if not request.session_id or time.monotonic() > deadline:
                    raise
            time.sleep(CREATE_RETRY_INTERVAL_S)

    def read_batch(self, reads: list[tuple[str, int, int]]) -> list[bytes]:
        """``FileSystem.read_batch``: one BatchStat for the files, then all chunks in one batch."""
        jobs = self._read_jobs(reads)
        storage = self._conn.storage

        async def all_reads() -> list[bytearray | memoryview]:
            return list(
                await asyncio.gather(
                    *(read_spans(storage, layout, cap, off, size, p) for p, layout, cap, off, size in jobs)
                )
            )

        return [bytes(b) for b in self._conn.run(all_reads())]

    def read_batch_into(self, reads: list[tuple[str, int, int]], buffers: Sequence[Any]) -> list[int]:
        """``FileSystem.read_batch_into``: into the caller's buffers; the number of bytes each read."""
        if len(buffers) != len(reads):
            raise ValueError(f"{len(reads)} reads but {len(buffers)} buffers")
        views = [memoryview(b).cast("B") for b in buffers]
        for n, ((p, _, length), view) in enumerate(zip(reads, views, strict=True)):
            if view.readonly or (length != WHOLE_FILE and len(view) < length):
                raise ValueError(f"buffers[{n}] ({p}): must be writable and hold {length} bytes")
        jobs = self._read_jobs(reads)
        for n, ((p, _, _, _, size), view) in enumerate(zip(jobs, views, strict=True)):
            if len(view) < size:
                raise ValueError(f"buffers[{n}] ({p}): holds {len(view)} bytes, the read is {size}")
        storage = self._conn.storage

        async def all_reads() -> None:
            await asyncio.gather(
                *(
                    read_spans(storage, layout, cap, off, size, p, view[:size])
                    for (p, layout, cap, off, size), view in zip(jobs, views, strict=True)
                )
            )

        self._conn.run(all_reads())
        return [size for _, _, _, _, size in jobs]

    def _read_jobs(self, reads: list[tuple[str, int, int]]) -> list[tuple[str, FileLayout, bytes, int, int]]:
        """Each read's (path, layout, read capability, offset, bytes to read): one BatchStat for the files."""
        paths = list(dict.fromkeys(p for p, _, _ in reads))
        resp = self._meta_call(
            lambda m: m.batch_stat,
            pb.BatchStatRequest(
                paths=[path_at(p) for p in paths], follow_last_symlink=True, include_read_capability=True
            ),
        )
        files: dict[str, tuple[pb.Inode, bytes]] = {}
        for p, r in zip(paths, resp.results, strict=True):
            if r.error:
                code = ERRNO_OF_FS_ERROR.get(pb.FsError.Name(r.error), errno.EIO)
                raise OSError(code, os.strerror(code), p)
            if r.inode.type != pb.INODE_TYPE_FILE:
                raise IsADirectoryError(errno.EISDIR, "Is a directory", p)
            if not r.read_capability.token:
                raise PermissionError(errno.EACCES, "Permission denied", p)
            files[p] = (r.inode, r.read_capability.token)
        layouts = {p: self._conn.layout(files[p][0]) for p in paths}
        jobs = []
        for p, off, n in reads:
            inode, cap = files[p]
            jobs.append((p, layouts[p], cap, off, max(0, min(n, inode.length_bytes - off))))
        return jobs

    def write_batch(self, writes: list[tuple[str, int, bytes]]) -> None:
        """``FileSystem.write_batch``: one write session per file, all chunks in one batch."""
        opened: dict[str, RawFile] = {}
        om = OpenMode.parse("r+b")
        try:
            for p, _, _ in writes:
                if p not in opened:
                    opened[p] = self.open(
                        p,
                        "r+b",
                        om,
                        buffering=0,
                        perm=0o644,
                        encoding=None,
                        errors=None,
                        newline=None,
                        write_only=False,
                    )
            for p, off, data in writes:
                opened[p].ensure_room(off + len(data))
            storage = self._conn.storage

            async def all_writes() -> None:
                await asyncio.gather(
                    *(
                        write_spans(storage, opened[p].layout, opened[p]._cap, off, memoryview(data), p)
                        for p, off, data in writes
                    )
                )

            self._conn.run(all_writes())
            for p, off, data in writes:
                raw = opened[p]
                raw.written = max(raw.written, off + len(data))
                raw.length = max(raw.length, off + len(data))
        finally:
            for raw in opened.values():
                raw.close()
