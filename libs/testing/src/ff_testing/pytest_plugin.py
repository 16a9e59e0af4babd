"""Pytest fixtures for every package's tests: databases (SQLite file, real PostgreSQL), a fork server for torch ranks.

Registered for the whole repository by the root conftest.py (``pytest_plugins``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ff_config import ports
from ff_testing.forkserver import ForkServer
from ff_testing.postgres import PostgresServer, running_postgres

# What torch ranks of the tests import before they run (the example trainers' too): imported once by the fork
# server (see torch_forks). None of it starts a thread on import, which a fork would leave broken.
TORCH_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn",
    "torch._dynamo",  # imported by the first optimizer a rank makes (Optimizer.__init__): ~2.7 s of CPU each
    "hfreduce.distributed",
    "haiscale.ddp",
    "haiscale.checkpoint",
    "haiscale.pipeline",
    "haiscale.fsdp",
    "hfai.telemetry",
    "hfai.client",
    "hf3fs",
    "fsspec",
)

# db_url's parameters, and the fixture giving each one's URL.
_DATABASE_FIXTURES = {"sqlite": "sqlite_url", "postgresql": "postgres_url"}


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker picks ports only from its own share of the range.

    So the clusters two workers start side by side (services, the appliance's planned ports) cannot pick the same
    free port and race to bind it.
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and count.isdigit():  # (a range set for the whole run is shared out the same way)
        os.environ[ports.PORT_RANGE_ENV] = ports.share_of_range(int(worker[2:]), int(count))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the test session, started on first use."""
    with running_postgres() as server:
        yield server


@pytest.fixture(scope="session")
def torch_forks() -> Iterator[ForkServer]:
    """A fork server that imported torch once for this test session (xdist worker).

    Tests start the ranks of their training jobs from it, each for the cost of a fork instead of ~3 s of CPU
    importing torch.
    """
    with ForkServer(TORCH_PRELOAD, env={"OMP_NUM_THREADS": "1"}) as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """URL of a new, empty PostgreSQL database, dropped after the test."""
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a SQLite file (not yet created) in the test's temp folder."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture(params=sorted(_DATABASE_FIXTURES))
def db_url(request: pytest.FixtureRequest) -> str:
    """Runs the test once on a SQLite file and once on a fresh PostgreSQL database."""
    url: str = request.getfixturevalue(_DATABASE_FIXTURES[request.param])
    return url
