"""Alembic environment of the collector: the shared runner of ff_store, with the collector's tables."""

from ff_store import run_env
from ff_telemetry.store.schema import metadata

run_env(metadata)
