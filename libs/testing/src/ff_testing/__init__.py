"""The test harness of every package: a real PostgreSQL server, free ports, service processes.

The services' harnesses are modules of their own, imported where used (this package's import stays light):
``ff_testing.mgmtd``, ``ff_testing.cluster`` (mgmtd and storage services), ``ff_testing.meta``,
``ff_testing.scheduler``, ``ff_testing.agent``, ``ff_testing.telemetry``, ``ff_testing.hostile`` (hostile input
on the wire) and ``ff_testing.chaos`` (storage's linearizability workload). No production package imports them.
"""

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
