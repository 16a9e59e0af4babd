"""Calls done once: a mutating call sent again with the same key answers what it did the first time.

A client whose connection is lost mid-call cannot know whether a Rename, Remove or Mkdirs ran; sent again, it would
apply twice (a second Rename finds its source gone, a second Remove takes a file made meanwhile under the name). So
the client gives such a call a key that stays the same across its attempts (``ff_rpc.once.ONCE_HEADER``), and meta
records the call's result under that key in the call's own transaction: an attempt whose key is recorded answers
the recorded result and changes nothing. 3FS's meta does the same with its idempotent records (client id and
request id). A key is the caller's: the servicer binds it to the method and the caller's uid, so one user's key never
replays another's result. Records are kept ``KEEP_S`` (far longer than a client retries) and then pruned.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, TypeVar

from ff_meta.core.model import Inode, InodeType
from ff_meta.store.tx import Tx, raw_sql

T = TypeVar("T")

# How long a record is kept: a client retries a call for seconds (its deadline), not for minutes.
KEEP_S = 600.0

_RAW_FIND = raw_sql("SELECT result FROM meta_once WHERE once_key = ?")
_RAW_RECORD = raw_sql("INSERT INTO meta_once (once_key, result, recorded_at_ns) VALUES (?, ?, ?)")
# Pruned in batches, each its own short transaction: a backlog (meta down for a while) never holds the writer long.
PRUNE_BATCH = 2000
_RAW_OLD = raw_sql("SELECT COUNT(*) FROM (SELECT once_key FROM meta_once WHERE recorded_at_ns < ? LIMIT ?) AS old")
_RAW_PRUNE = raw_sql(
    "DELETE FROM meta_once WHERE once_key IN (SELECT once_key FROM meta_once WHERE recorded_at_ns < ? LIMIT ?)"
)


def once(key: str | None, body: Callable[[Tx], T]) -> Callable[[Tx], T]:
    """``body``, done once per ``key`` (None: every time): a recorded key answers its result, else it records it."""
    if key is None:
        return body

    def done_once(tx: Tx) -> T:
        row = tx.fetch_all(_RAW_FIND, (key,))
        if row:
            return _decoded(row[0][0])  # type: ignore[no-any-return]
        result = body(tx)
        tx.execute(_RAW_RECORD, (key, _encoded(result), tx.now_ns))
        return result

    return done_once


def prune(tx: Tx) -> int:
    """Drop up to ``PRUNE_BATCH`` records older than ``KEEP_S``; how many went (fewer: none older is left)."""
    params = (tx.now_ns - int(KEEP_S * 1e9), PRUNE_BATCH)
    [(old,)] = tx.fetch_all(_RAW_OLD, params)
    if old:
        tx.execute(_RAW_PRUNE, params)
    return int(old)


def _encoded(result: Any) -> str:
    """A call's result as text: an inode (its row), a string (a trash id, a path), None, or a tuple of those."""
    return json.dumps(_tagged(result))


def _tagged(result: Any) -> dict[str, Any]:
    if isinstance(result, Inode):
        return {"inode": {**dataclasses.asdict(result), "type": int(result.type)}}
    if result is None or isinstance(result, str):
        return {"value": result}
    if isinstance(result, tuple):
        return {"tuple": [_tagged(r) for r in result]}
    raise TypeError(f"a call done once returns inodes, strings or None, not {type(result).__name__}")


def _decoded(text: str) -> Any:
    return _untagged(json.loads(text))


def _untagged(got: dict[str, Any]) -> Any:
    if "inode" in got:  # the fields this meta knows (a record may come from a newer one during an upgrade)
        fields = {k: v for k, v in got["inode"].items() if k in _INODE_FIELDS}
        return Inode(**{**fields, "type": InodeType(fields["type"])})
    if "tuple" in got:
        return tuple(_untagged(r) for r in got["tuple"])
    return got["value"]


_INODE_FIELDS = frozenset(f.name for f in dataclasses.fields(Inode))
