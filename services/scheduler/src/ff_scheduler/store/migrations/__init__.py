"""Alembic migrations of the scheduler's schema (``ff_store.open_store`` applies them at start)."""
