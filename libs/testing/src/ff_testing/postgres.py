"""A real, throwaway PostgreSQL server in a temp folder, and a fresh database per test."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
from psycopg import sql

from ff_testing.ports import free_port

SUPERUSER = "postgres"
# PostgreSQL refuses to run as root; as root we hand the server to this system user.
SYSTEM_USER = "postgres"
HOST = "127.0.0.1"
SEARCH_DIRS_GLOB = "/usr/lib/postgresql/*/bin"

_NUM_START_ATTEMPTS = 3
_START_TIMEOUT_S = 30
# Throwaway data: no durability, small memory, enough connections for a pool per test.
_SETTINGS = {
    "listen_addresses": HOST,
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "100",
}


class PostgresServerError(RuntimeError):
    """The PostgreSQL server binaries are not installed, or initdb/pg_ctl failed (the message says why)."""


@dataclass(frozen=True, kw_only=True)
class PostgresServer:
    """A running server: superuser ``postgres``, trust auth, on 127.0.0.1 and a socket in ``base_dir``."""

    bin_dir: Path
    base_dir: Path
    port: int
    run_as: str | None
    """The system user the server runs as when we are root, else None (it runs as us)."""

    @property
    def data_dir(self) -> Path:
        """The cluster's data folder (initdb's, owned by ``run_as`` when set)."""
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        """Where the server puts its Unix socket, instead of the system's /var/run/postgresql."""
        return self.base_dir / "sockets"

    @property
    def log_file(self) -> Path:
        """The server's log (pg_ctl -l); its end is in the error when the server fails to start."""
        return self.base_dir / "postgres.log"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` maintenance database."""
        return self.database_url("postgres")

    def database_url(self, database: str) -> str:
        """SQLAlchemy URL (psycopg 3 driver) of ``database`` on this server, as the superuser."""
        return f"postgresql+psycopg://{SUPERUSER}@{HOST}:{self.port}/{database}"

    def create_database(self) -> str:
        """Creates an empty database ``test_<random>`` and returns its SQLAlchemy URL."""
        name = f"test_{secrets.token_hex(8)}"
        self._execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.database_url(name)

    def drop_database(self, url: str) -> None:
        """Drops the database ``create_database`` returned, closing any connection still open to it."""
        prefix = self.database_url("")
        if not url.startswith(prefix):
            raise ValueError(f"{url!r} is not a database of this server ({prefix}...)")
        name = url.removeprefix(prefix)
        self._execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def stop(self) -> None:
        """Stops the server at once (no checkpoint: the data is thrown away) and removes its folder."""
        try:
            _run([self.bin_dir / "pg_ctl", "stop", "-D", self.data_dir, "-m", "immediate", "-w"], self)
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _execute(self, statement: sql.Composed) -> None:
        with psycopg.connect(
            host=HOST, port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True
        ) as connection:
            connection.execute(statement)


def find_bin_dir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``: from PATH, else the newest Debian one.

    Raises:
        PostgresServerError: no PostgreSQL server installation was found.
    """
    candidates: list[Path] = []
    on_path = shutil.which("pg_ctl")
    if on_path is not None:
        # Resolve symlinks: pg_ctl looks for `postgres` next to its real location.
        candidates.append(Path(on_path).resolve().parent)
    by_version = sorted(Path("/").glob(SEARCH_DIRS_GLOB.lstrip("/")), key=_major_version, reverse=True)
    candidates.extend(by_version)
    for bin_dir in candidates:
        if all((bin_dir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return bin_dir
    raise PostgresServerError(
        f"PostgreSQL server binaries (initdb, pg_ctl, postgres) are neither on PATH nor in {SEARCH_DIRS_GLOB}; "
        "install them, e.g. `apt-get install postgresql-15`"
    )


def start_postgres(*, parent_dir: Path | None = None) -> PostgresServer:
    """Initializes a cluster in a new temp folder and starts a server on a free port.

    Args:
        parent_dir: where to make the temp folder (default: the system temp folder). As root it must be
            reachable by the ``postgres`` user, so not under a private folder such as pytest's tmp_path.

    Raises:
        PostgresServerError: binaries missing, or initdb or the server failed (the message has its log).
    """
    bin_dir = find_bin_dir()
    run_as = SYSTEM_USER if os.geteuid() == 0 else None
    base_dir = Path(tempfile.mkdtemp(prefix="ff-postgres-", dir=parent_dir))
    server = PostgresServer(bin_dir=bin_dir, base_dir=base_dir, port=free_port(HOST), run_as=run_as)
    try:
        server.socket_dir.mkdir()
        if run_as is not None:
            for path in (base_dir, server.socket_dir):
                shutil.chown(path, user=run_as, group=run_as)
        _init_cluster(server)
        return _start_on_free_port(server)
    except BaseException:
        if (server.data_dir / "postmaster.pid").exists():
            # pg_ctl gave up waiting (or was interrupted) but the server may be up: leave no orphan.
            with suppress(PostgresServerError):
                server.stop()
        shutil.rmtree(base_dir, ignore_errors=True)
        raise


@contextmanager
def running_postgres(*, parent_dir: Path | None = None) -> Iterator[PostgresServer]:
    """``start_postgres``, stopped and removed on exit."""
    server = start_postgres(parent_dir=parent_dir)
    try:
        yield server
    finally:
        server.stop()


def _init_cluster(server: PostgresServer) -> None:
    _run(
        [
            server.bin_dir / "initdb",
            "-D",
            server.data_dir,
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ],
        server,
    )
    settings = {**_SETTINGS, "unix_socket_directories": str(server.socket_dir)}
    lines = [f"{name} = {_quote(value)}\n" for name, value in settings.items()]
    with (server.data_dir / "postgresql.conf").open("a") as conf:
        conf.writelines(lines)


def _start_on_free_port(server: PostgresServer) -> PostgresServer:
    attempt = 1
    while True:
        server.log_file.unlink(missing_ok=True)
        command: list[str | Path] = [server.bin_dir / "pg_ctl", "start", "-D", server.data_dir]
        command += ["-l", server.log_file, "-w", "-t", str(_START_TIMEOUT_S), "-o", f"-p {server.port}"]
        try:
            _run(command, server)
        except PostgresServerError as error:
            log = server.log_file.read_text() if server.log_file.exists() else ""
            if "could not bind" not in log or attempt == _NUM_START_ATTEMPTS:
                raise PostgresServerError(f"{error}\nthe server's log:\n{log[-4000:]}") from None
        else:
            return server
        # Another process took the free port before the server could bind it: try another one.
        server = replace(server, port=free_port(HOST))
        attempt += 1


def _run(command: Sequence[str | Path], server: PostgresServer) -> None:
    args = [str(part) for part in command]
    if server.run_as is not None:
        args = ["runuser", "-u", server.run_as, "--", *args]
    # cwd: the server user may not be allowed into the caller's working directory.
    result = subprocess.run(args, cwd=server.base_dir, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        message = f"{' '.join(args)} exited with {result.returncode}:\n{result.stdout}{result.stderr}"
        if server.run_as is not None:
            message += f"\n(as root, the server runs as {server.run_as!r}, who must be able to enter {server.base_dir})"
        raise PostgresServerError(message)


def _quote(value: str) -> str:
    escaped = value.replace("'", "''")
    return f"'{escaped}'"


def _major_version(bin_dir: Path) -> int:
    version = bin_dir.parent.name
    return int(version) if version.isdigit() else -1
