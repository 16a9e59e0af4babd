"""A file's bytes to and from storage: byte ranges split into the chunk IOs of its layout, one batch per call.

The one place a file offset becomes (chain, chunk, offset) IOs: ``RawFile``, the batch API (``fs/data.py``) and the
connection's layouts (``fs/connection.py``) use it.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

from ff_fsprotocol.layout import FileLayout, file_chains
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.storage.v1 import storage_pb2 as spb
from hf3fs.storage_client import ChunkRead, ChunkWrite, StorageClient, StorageIoError


def _io_error(message: str, path: str, code: int = errno.EIO) -> OSError:
    """The OSError of a failed read or write of ``path`` (EIO unless ``code`` says otherwise)."""
    return OSError(code, message, path)


async def read_spans(
    storage: StorageClient,
    layout: FileLayout,
    cap: bytes,
    offset: int,
    length: int,
    path: str,
    into: memoryview | None = None,
) -> bytearray | memoryview:
    """Bytes ``[offset, offset + length)`` of a file from storage; holes and short chunks read as zeros.

    ``into`` (writable, ``length`` bytes): the chunks land there straight from the transport (no copy), and
    it is what is returned; without it, a new buffer is.
    """
    out = memoryview(bytearray(length)) if into is None else into
    if len(out) != length or out.readonly:
        raise ValueError(f"read into a buffer of {len(out)} bytes (readonly: {out.readonly}), not {length}")
    spans = layout.spans(offset, length)
    ios = [
        ChunkRead(
            chain_id=s.chain_id,
            inode_id=layout.inode_id,
            chunk_index=s.chunk_index,
            offset=s.offset,
            length=s.length,
            capability=cap,
            buffer=out[s.file_offset - offset :][: s.length],
        )
        for s in spans
    ]
    try:
        outcomes = await storage.batch_read(ios)
    except StorageIoError as err:
        raise _io_error(f"read refused by storage: {err}", path, _errno_of(err)) from None
    for s, o in zip(spans, outcomes, strict=True):
        pos = s.file_offset - offset
        got = 0
        if o.ok:
            got = len(o.data)
            if not (isinstance(o.data, memoryview) and o.data.obj is out.obj):  # not landed in place (no buffer use)
                out[pos : pos + got] = o.data
        elif o.status != spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND:
            raise _io_error(f"read of chunk {s.chunk_index} failed: {o.message or o.status}", path)
        if got < s.length:  # a hole or a short chunk: zeros (also in a new buffer: a failed attempt may have written)
            out[pos + got : pos + s.length] = bytes(s.length - got)
    return out.obj if into is None else out  # type: ignore[return-value]  # the bytearray made above


async def write_spans(
    storage: StorageClient,
    layout: FileLayout,
    cap: bytes,
    offset: int,
    data: memoryview,
    path: str,
    more: Sequence[tuple[int, memoryview]] = (),
) -> None:
    """Write ``data`` at ``offset`` of a file, and each of ``more`` (offset, bytes) too, to storage in one batch.

    Raises:
        OSError: storage refused the batch or a chunk write failed (with the errno of the failure).
    """
    spans = [(s, at, piece) for at, piece in ((offset, data), *more) for s in layout.spans(at, len(piece))]
    ios = [
        ChunkWrite(
            chain_id=s.chain_id,
            inode_id=layout.inode_id,
            chunk_index=s.chunk_index,
            offset=s.offset,
            data=piece[s.file_offset - at : s.file_offset - at + s.length],
            chunk_size=layout.chunk_size,
            capability=cap,
        )
        for s, at, piece in spans
    ]
    try:
        outcomes = await storage.batch_write(ios)
    except StorageIoError as err:
        raise _io_error(f"write refused by storage: {err}", path, _errno_of(err)) from None
    for (s, _, _), o in zip(spans, outcomes, strict=True):
        if not o.ok:
            code = errno.ENOSPC if o.status == spb.CHUNK_IO_STATUS_NO_SPACE else errno.EIO
            raise _io_error(f"write of chunk {s.chunk_index} failed: {o.message or o.status}", path, code)


def _errno_of(err: StorageIoError) -> int:
    name = err.code.name if err.code is not None else ""
    return errno.EACCES if name in ("PERMISSION_DENIED", "UNAUTHENTICATED") else errno.EIO


def layout_of(inode: pb.Inode, table: Sequence[int]) -> FileLayout:
    """The chains of a file's chunks, from its inode's layout and its chain table's chain ids."""
    lay = inode.layout
    chains = file_chains(table, lay.chain_begin_index, lay.stripe_size, lay.shuffle_seed)
    return FileLayout(inode.inode_id, lay.chunk_size_bytes, tuple(chains))
