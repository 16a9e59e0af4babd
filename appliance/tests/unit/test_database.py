"""``fireflyer up --database``: which URLs it takes, and each service's URL (its own schema on the search path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from ff_appliance import database
from ff_appliance.state import StateDir


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqlite:///x.db", "takes a PostgreSQL URL"),
        ("mysql://u@h/db", "takes a PostgreSQL URL"),
        ("postgresql+asyncpg://u@h/db", "takes a PostgreSQL URL"),
        ("postgresql://u@h:5432", "names no database"),
        ("postgresql://u@h/db?options=-cfoo", "may not set options"),
        ("not a url", "not a database URL"),
        ("postgresql://u:pw@h:5x/db", "not a database URL"),  # a bad port: refused, no traceback
    ],
)
def test_unusable_urls_are_refused(url: str, says: str) -> None:
    with pytest.raises(database.DatabaseError, match=says):
        database.parse(url)


def test_each_service_gets_its_schema_first_on_the_search_path() -> None:
    urls = database.service_urls("postgresql://u:p%40ss@h:5433/db?sslmode=require", ["mgmtd", "meta"])
    mgmtd = make_url(urls["mgmtd"])
    assert (mgmtd.drivername, mgmtd.username, mgmtd.password, mgmtd.host, mgmtd.port, mgmtd.database) == (
        "postgresql+psycopg",
        "u",
        "p@ss",
        "h",
        5433,
        "db",
    )
    assert dict(mgmtd.query) == {"sslmode": "require", "options": "-csearch_path=fireflyer_mgmtd"}
    assert make_url(urls["meta"]).query["options"] == "-csearch_path=fireflyer_meta"


def test_the_first_choice_is_kept_and_never_changed(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    assert database.chosen_url(state, None) is None  # a SQLite cluster
    url = database.chosen_url(state, "postgresql://u@h/db")
    assert url is not None
    database.keep(state, url)
    assert database.chosen_url(state, None) == url and database.chosen_url(state, "postgresql+psycopg://u@h/db") == url
    with pytest.raises(database.DatabaseError, match="cannot move to another database"):
        database.chosen_url(state, "postgresql://u@h/other")
    rotated = database.chosen_url(state, "postgresql://u:new-password@h/db")  # only the password changed: taken
    assert rotated is not None and make_url(rotated).password == "new-password"
    database.keep(state, rotated)
    assert database.chosen_url(state, None) == rotated
