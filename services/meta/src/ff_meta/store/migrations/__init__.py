"""Alembic migrations of meta's tables (``versions/``), run by ``ff_store.open_store`` at start."""
