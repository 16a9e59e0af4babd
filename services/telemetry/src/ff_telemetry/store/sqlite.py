"""SQLite durability of the collector's store: ``PRAGMA synchronous`` on every connection.

ff_store opens SQLite in WAL mode with the default ``synchronous = FULL``: every commit waits for an
fsync of the WAL (5-10 ms on the shared VM), which caps group-committed ingest at one batch group per
fsync. The collector defaults to ``NORMAL``: a commit survives the collector process crashing or being
killed (the WAL is in the OS's page cache), only an OS crash or power loss may lose the transactions
since the last checkpoint, the durability Prometheus's own WAL offers (it is not fsynced per append).
``FULL`` keeps every acknowledged push across a power loss too, at the fsync's cost.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Literal

from sqlalchemy import Engine, event

Synchronous = Literal["FULL", "NORMAL"]


def set_synchronous(engine: Engine, level: Synchronous) -> None:
    """``PRAGMA synchronous = level`` on every connection of a SQLite engine (nothing on PostgreSQL)."""
    if engine.dialect.name != "sqlite":
        return
    if level not in ("FULL", "NORMAL"):
        raise ValueError(f"synchronous must be FULL or NORMAL, not {level!r}")

    def on_connect(connection: sqlite3.Connection, _record: Any) -> None:
        connection.execute(f"PRAGMA synchronous = {level}")

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # the connections opened before (migrations) are closed, new ones get the pragma
