"""File layout rules (pure): the chain table, chunk size and stripe of a new file, and the chunk size bounds."""

from __future__ import annotations

from typing import Any

from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.model import Defaults, Inode, LayoutSpec

MIN_CHUNK = 64 * 1024
MAX_CHUNK = 64 * 1024 * 1024


def check_chunk_size(chunk: int) -> None:
    """A chunk size is a power of two from 64 KiB to 64 MiB (EINVAL otherwise)."""
    if chunk < MIN_CHUNK or chunk > MAX_CHUNK or chunk & (chunk - 1):
        raise fs_error(FsCode.INVALID_ARGUMENT, f"chunk size {chunk} must be a power of two from 64 KiB to 64 MiB")


def choose_layout(parent: Inode, asked: LayoutSpec | None, defaults: Defaults, inode_id: int) -> dict[str, Any]:
    """The layout columns of a new file.

    The asked layout, else its directory's (which a new directory copies from its parent), else the defaults. ENOSPC
    when the default chain table does not exist, EINVAL when one a request or directory names does not.
    """
    spec = asked if asked is not None and asked.chain_table_id else None
    if spec is None and parent.chain_table_id:
        spec = LayoutSpec(parent.chain_table_id, parent.chunk_size, parent.stripe_size)
    spec = spec or defaults.layout
    table_id = spec.chain_table_id or defaults.layout.chain_table_id
    chunk = (asked.chunk_size if asked and asked.chunk_size else 0) or spec.chunk_size or defaults.layout.chunk_size
    stripe = (
        (asked.stripe_size if asked and asked.stripe_size else 0) or spec.stripe_size or defaults.layout.stripe_size
    )
    check_chunk_size(chunk)
    if table_id not in defaults.tables:
        if spec is defaults.layout or table_id == defaults.layout.chain_table_id:
            raise fs_error(FsCode.NO_SPACE, f"the default chain table {table_id} does not exist (is storage set up?)")
        named_by = "request" if spec is asked else "directory"
        raise fs_error(
            FsCode.INVALID_ARGUMENT,
            f"chain table {table_id} (named by the {named_by}'s layout) does not "
            f"exist; chain tables: {sorted(defaults.tables)}",
        )
    version, n = defaults.tables[table_id]
    stripe = max(1, min(stripe, n))
    # Round-robin start over the table; the seed from the id so that a re-run picks the same.
    seed = (inode_id * 0x9E3779B97F4A7C15) & ((1 << 63) - 1)
    return {
        "chain_table_id": table_id,
        "chain_table_version": version,
        "chunk_size": chunk,
        "stripe_size": stripe,
        "chain_begin": inode_id % n,
        "shuffle_seed": seed,
    }
