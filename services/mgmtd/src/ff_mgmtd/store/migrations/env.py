"""Alembic environment of mgmtd: the shared runner of ff_store, with mgmtd's tables."""

from ff_mgmtd.store.schema import metadata
from ff_store import run_env

run_env(metadata)
