"""Test fixtures shared by every package: a real PostgreSQL server, free ports, service processes."""

from __future__ import annotations

from ff_testing.ports import free_port
from ff_testing.postgres import PostgresServer, PostgresServerError, running_postgres, start_postgres
from ff_testing.process import ServiceProcess, module_args, stop_all, wait_ready

__all__ = [
    "PostgresServer",
    "PostgresServerError",
    "ServiceProcess",
    "free_port",
    "module_args",
    "running_postgres",
    "start_postgres",
    "stop_all",
    "wait_ready",
]
