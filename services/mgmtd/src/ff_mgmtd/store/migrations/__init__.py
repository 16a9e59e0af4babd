"""Alembic migrations of mgmtd's schema (``alembic`` runs them from ``ff_store.open_store``)."""
