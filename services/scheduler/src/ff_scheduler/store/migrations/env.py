"""Alembic environment of the scheduler: the shared runner of ff_store, with the scheduler's tables."""

from ff_scheduler.store.schema import metadata
from ff_store import run_env

run_env(metadata)
