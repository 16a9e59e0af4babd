"""Alembic environment of the test schema, written the way a service writes its own."""

from ff_store.migrations import run_env

run_env(None)
