"""Alembic environment of meta: the shared runner of ff_store, with meta's tables."""

from ff_meta.store.schema import metadata
from ff_store import run_env

run_env(metadata)
