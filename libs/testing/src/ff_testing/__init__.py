"""Test fixtures shared by every package: a real PostgreSQL server, free ports."""

from __future__ import annotations

from ff_testing.ports import free_port
from ff_testing.postgres import PostgresServer, PostgresServerError, running_postgres, start_postgres

__all__ = ["PostgresServer", "PostgresServerError", "free_port", "running_postgres", "start_postgres"]
