"""The shared PostgreSQL fixtures: a real server, one fresh database per test."""

from __future__ import annotations

import os
import pwd
import socket

import psycopg
import pytest

from ff_testing import PostgresServer, free_port, postgres, running_postgres


def connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def test_each_test_gets_a_fresh_empty_database(postgres_server: PostgresServer, postgres_url: str) -> None:
    other_url = postgres_server.create_database()
    try:
        assert other_url != postgres_url
        with connect(postgres_url) as connection:
            connection.execute("CREATE TABLE only_here (x int)")
        with connect(other_url) as connection:
            row = connection.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'only_here'").fetchone()
        assert row == (0,)
    finally:
        postgres_server.drop_database(other_url)


def test_dropped_database_is_gone(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database()
    name = url.rsplit("/", 1)[1]
    open_connection = connect(url)  # DROP ... WITH (FORCE) closes it
    try:
        postgres_server.drop_database(url)
    finally:
        open_connection.close()

    with connect(postgres_server.url) as connection:
        row = connection.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert row == (0,)


def test_server_listens_only_on_loopback_with_its_settings(postgres_server: PostgresServer) -> None:
    with connect(postgres_server.url) as connection:
        settings = dict(
            connection.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (["listen_addresses", "fsync", "max_connections", "unix_socket_directories", "server_version_num"],),
            ).fetchall()
        )
    assert settings["listen_addresses"] == "127.0.0.1"
    assert settings["fsync"] == "off"
    assert settings["max_connections"] == "100"
    assert settings["unix_socket_directories"] == str(postgres_server.socket_dir)
    assert int(str(settings["server_version_num"])) >= 150000


def test_server_runs_as_the_postgres_user_when_we_are_root(postgres_server: PostgresServer) -> None:
    owner = pwd.getpwuid(postgres_server.data_dir.stat().st_uid).pw_name
    if os.geteuid() == 0:
        assert (postgres_server.run_as, owner) == ("postgres", "postgres")
    else:
        assert (postgres_server.run_as, owner) == (None, pwd.getpwuid(os.geteuid()).pw_name)


def test_db_url_covers_both_databases(db_url: str, request: pytest.FixtureRequest) -> None:
    expected_prefix = {"sqlite": "sqlite:///", "postgresql": "postgresql+psycopg://"}
    assert db_url.startswith(expected_prefix[request.node.callspec.params["db_url"]])


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        assert sock.getsockname()[1] == port


def test_start_moves_to_another_port_when_its_port_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken_port = squatter.getsockname()[1]
        ports = iter([taken_port, free_port()])
        monkeypatch.setattr(postgres, "free_port", lambda host: next(ports))

        with running_postgres() as server, connect(server.url) as connection:
            assert server.port != taken_port
            assert connection.execute("SELECT current_setting('port')").fetchone() == (str(server.port),)
    assert not server.base_dir.exists()
