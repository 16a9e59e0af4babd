"""The database's clock, which every instance of a service agrees on (unlike their own clocks)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

# Wall-clock time at the moment of the statement (not the transaction start), as unix seconds.
_NOW_SQL = {
    "postgresql": text("SELECT extract(epoch FROM clock_timestamp())"),
    # julianday('now') has millisecond resolution; 2440587.5 is the Julian day of 1970-01-01T00:00Z.
    "sqlite": text("SELECT (julianday('now') - 2440587.5) * 86400.0"),
}


def db_now(session: Session) -> float:
    """The database server's current time in unix seconds, with sub-second resolution.

    Use it for leases and deadlines stored in the database, so that instances on machines whose clocks
    differ still agree on who has expired.
    """
    dialect = session.get_bind().dialect.name
    try:
        statement = _NOW_SQL[dialect]
    except KeyError:
        raise ValueError(f"db_now does not support the {dialect!r} database") from None
    return float(session.execute(statement).scalar_one())
