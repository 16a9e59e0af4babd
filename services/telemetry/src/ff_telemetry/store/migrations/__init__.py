"""Alembic migrations of the telemetry store's schema (``ff_store.open_store`` applies them at start)."""
