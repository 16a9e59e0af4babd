"""SQL store for stateful services: engines, migrations, serializable transactions with retry."""

from __future__ import annotations

from ff_store.clock import db_now
from ff_store.engine import create_engine, read_only_engine
from ff_store.errors import StoreError, TransactionConflict
from ff_store.migrations import open_store, run_env, run_migrations
from ff_store.raw import RawTransaction, RawWriter
from ff_store.retry import ConflictRetry, is_retryable
from ff_store.store import Store

__all__ = [
    "ConflictRetry",
    "RawTransaction",
    "RawWriter",
    "Store",
    "StoreError",
    "TransactionConflict",
    "create_engine",
    "db_now",
    "is_retryable",
    "open_store",
    "read_only_engine",
    "run_env",
    "run_migrations",
]
