"""``fireflyer up --database URL``: the stateful services keep their state on one PostgreSQL database.

mgmtd, meta, the scheduler and telemetry use it instead of SQLite files under the state folder.

Each service gets a schema of its own in that database (``fireflyer_mgmtd``, ...; made at every ``up`` if
missing), reached through the connection's ``search_path``: their tables and migration histories never meet, and
the user needs one database, not four. The URL is chosen at a cluster's first ``up`` and kept in the state
folder's secrets (it may hold a password); every later ``up`` uses it. It reaches the services in their
environment (``FF_<SERVICE>_DATABASE_URL``), never on a command line another user could read in ``ps``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ff_appliance.state import StateDir, load_plan, read_secret, write_secret

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

# SQLAlchemy is imported where a URL is given: every `fireflyer` command imports this module, and on SQLite
# (the default) it would only add ~0.8 s to each command's start.

SCHEMA_PREFIX = "fireflyer_"
OWNER_SCHEMA = f"{SCHEMA_PREFIX}appliance"  # which cluster the database holds
CONNECT_TIMEOUT_S = 10


class DatabaseError(Exception):
    """The database URL is unusable, or the database cannot be reached or prepared (the message says why)."""


def parse(url: str) -> URL:
    """A PostgreSQL URL the services can use (``postgresql://`` or ``postgresql+psycopg://``).

    Raises:
        DatabaseError: anything else, or a URL that sets the connection's ``options`` (the appliance sets them).
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018  # a bad port raises here (ValueError), not at the first connection
    except (ArgumentError, ValueError) as err:
        raise DatabaseError(f"not a database URL: {str(err).splitlines()[0]}") from None
    if parsed.get_backend_name() != "postgresql" or parsed.get_driver_name() not in ("psycopg", "psycopg2"):
        raise DatabaseError(
            f"--database takes a PostgreSQL URL (postgresql://user:password@host:port/database), not "
            f"{parsed.drivername}:// (SQLite is the default: leave --database out)"
        )
    if not parsed.database:
        raise DatabaseError("the database URL names no database (postgresql://user@host:port/DATABASE)")
    if "options" in parsed.query:
        raise DatabaseError("the database URL may not set options: the appliance sets each service's search_path")
    return parsed.set(drivername="postgresql+psycopg")


def chosen_url(state: StateDir, given: str | None) -> str | None:
    """The cluster's database URL: the one kept from its first ``up``, or ``given`` for a new cluster.

    The caller keeps a new cluster's URL (``keep``) once its database is prepared.

    A ``given`` URL that differs from the kept one only in its password replaces it (a rotated password).

    Raises:
        DatabaseError: ``given`` names another database than the kept one, or the cluster runs on SQLite files.
    """
    kept = read_secret(state.database_url_file)
    if given is None:
        return kept
    url = parse(given).render_as_string(hide_password=False)
    if kept is not None:
        if parse(kept)._replace(password=None) != parse(url)._replace(password=None):  # (URL is a namedtuple)
            raise DatabaseError(
                f"this cluster keeps its state on {parse(kept).render_as_string()}; it cannot move to another "
                f"database (start a new cluster with another --state-dir)"
            )
        return url
    if load_plan(state) is not None:
        raise DatabaseError(
            f"this cluster keeps its state in SQLite files under {state.root}; it cannot move to PostgreSQL "
            "(start a new cluster with another --state-dir)"
        )
    return url


def keep(state: StateDir, url: str) -> None:
    """Remember the cluster's database for every later ``up`` (with the other secrets: it may hold a password)."""
    if read_secret(state.database_url_file) != url:
        write_secret(state.database_url_file, url)


def service_urls(url: str, services: Sequence[str]) -> dict[str, str]:
    """Each service's URL: the database, with its own schema first on the search path."""
    base = parse(url)
    return {
        s: base.update_query_dict({"options": f"-csearch_path={SCHEMA_PREFIX}{s}"}).render_as_string(
            hide_password=False
        )
        for s in services
    }


def prepare(url: str, services: Sequence[str], owner: str) -> Mapping[str, str]:
    """Make every service's schema (if missing) and return the services' URLs (``service_urls``).

    The database records which cluster it holds (``owner``: a digest of the cluster token, in
    ``fireflyer_appliance.owner``): a second cluster, or this state folder made anew, never adopts another's
    registry, inodes and tasks.

    Raises:
        DatabaseError: the server cannot be reached, or refuses (login, rights to create schemas), or the
            database holds another cluster's state.
    """
    import sqlalchemy as sa
    from sqlalchemy.exc import SQLAlchemyError

    base = parse(url)
    engine = sa.create_engine(base, connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{OWNER_SCHEMA}"'))
            conn.execute(sa.text(f'CREATE TABLE IF NOT EXISTS "{OWNER_SCHEMA}".owner (cluster TEXT PRIMARY KEY)'))
            conn.execute(sa.text(f'LOCK TABLE "{OWNER_SCHEMA}".owner'))  # two first ups at once: one wins
            found = conn.execute(sa.text(f'SELECT cluster FROM "{OWNER_SCHEMA}".owner')).scalars().all()
            if not found:
                conn.execute(sa.text(f'INSERT INTO "{OWNER_SCHEMA}".owner VALUES (:c)'), {"c": owner})
            elif found != [owner]:
                raise DatabaseError(
                    f"{base.render_as_string()} holds another cluster's state (made with another cluster token): "
                    "give this cluster a database of its own"
                )
            for s in services:
                conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA_PREFIX}{s}"'))
    except SQLAlchemyError as err:
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise DatabaseError(f"cannot prepare {base.render_as_string()}: {reason}") from None
    finally:
        engine.dispose()
    return service_urls(url, services)


def owner_of(cluster_token: str) -> str:
    """What the database records as its cluster: a digest of the cluster token (not the token)."""
    return hashlib.sha256(b"fireflyer-database-owner\0" + cluster_token.encode()).hexdigest()
