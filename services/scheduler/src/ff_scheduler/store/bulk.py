"""Batched writes of many rows at once, as driver-level statements (the tick writes thousands of rows).

SQLAlchemy builds a dict of bound parameters per row and runs each value through its type's processor, ~10 us per
row: 0.1-0.2 s of a tick that starts 10,000 nodes' runs. These helpers hand tuples to the driver's ``executemany``
instead, in the driver's own parameter style (SQLite's ``?``, psycopg's ``%s``); JSON values are given as text.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.orm import Session

# Ids per IN list of batched statements (SQLite >= 3.32 takes 32,766 parameters, PostgreSQL 65,535).
IN_CHUNK = 5000
# Consecutive ids from which on a batched UPDATE names them as a range rather than one by one.
MIN_RANGE = 8


def placeholder(s: Session) -> str:
    """The driver's positional parameter marker."""
    return "?" if s.get_bind().dialect.paramstyle == "qmark" else "%s"


def as_json(value: Any) -> str:
    """A value for a JSON column as SQLAlchemy's JSON type stores it (None as JSON ``null``, as it does)."""
    return json.dumps(value)


def json_loader(s: Session) -> Callable[[Any], Any]:
    """Decodes a JSON column's value as the driver returns it: text on SQLite, already decoded by psycopg."""
    return _load_json if s.get_bind().dialect.name == "sqlite" else _as_is


def _load_json(value: str | None) -> Any:
    return None if value is None or value == "null" else json.loads(value)


def _as_is(value: Any) -> Any:
    return value


def select_rows(s: Session, table: Table, columns: Sequence[str], where: str = "") -> Sequence[Any]:
    """``SELECT columns FROM table [WHERE where]`` as driver rows (named tuples; no type processing).

    Booleans are whatever the driver gives (SQLite: 0 or 1) and JSON as ``json_loader`` decodes it.
    """
    _check_columns(table, columns)
    sql = f"SELECT {', '.join(columns)} FROM {table.name}" + (f" WHERE {where}" if where else "")
    return s.connection().exec_driver_sql(sql).fetchall()


def insert_rows(s: Session, table: Table, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
    """``INSERT`` the rows (values in ``columns``' order) in one driver ``executemany``."""
    if not rows:
        return
    _check_columns(table, columns)
    mark = placeholder(s)
    sql = f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({', '.join([mark] * len(columns))})"
    s.connection().exec_driver_sql(sql, list(rows))


def update_rows(s: Session, table: Table, key: str, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
    """Set ``columns`` of each row whose ``key`` is the last value of its tuple, in one driver ``executemany``."""
    if not rows:
        return
    _check_columns(table, [key, *columns])
    mark = placeholder(s)
    sets = ", ".join(f"{c} = {mark}" for c in columns)
    s.connection().exec_driver_sql(f"UPDATE {table.name} SET {sets} WHERE {key} = {mark}", list(rows))


def update_ids(s: Session, table: Table, key: str, values: dict[str, Any], ids: Iterable[int]) -> None:
    """Set the same ``values`` on the rows of ``ids``: runs of consecutive ids as ranges, the others in IN lists.

    A queue of tasks is mostly consecutive ids: SQLite updates 98,500 of 100,000 rows in ~85 ms of CPU by ~1,500
    ranges, ~150 ms by IN lists of 5,000 ids, ~200 ms one row per statement.
    """
    _check_columns(table, [key, *values])
    ranges, singles = id_ranges(sorted(set(ids)))
    mark = placeholder(s)
    names = list(values)
    sets = ", ".join(f"{c} = {mark}" for c in names)
    head = [values[c] for c in names]
    conn = s.connection()
    if ranges:
        sql = f"UPDATE {table.name} SET {sets} WHERE {key} BETWEEN {mark} AND {mark}"
        conn.exec_driver_sql(sql, [(*head, lo, hi) for lo, hi in ranges])
    for chunk in in_chunks(singles):
        # The ids are integers (written into the SQL: a parameter each would cost more than the update).
        id_list = ",".join(str(int(i)) for i in chunk)
        conn.exec_driver_sql(f"UPDATE {table.name} SET {sets} WHERE {key} IN ({id_list})", tuple(head))


def id_ranges(ids: Sequence[int], min_range: int = MIN_RANGE) -> tuple[list[tuple[int, int]], list[int]]:
    """Sorted distinct ``ids`` as inclusive ranges of at least ``min_range`` consecutive ids, and the ids left."""
    ranges: list[tuple[int, int]] = []
    singles: list[int] = []
    # Where a run of consecutive ids starts (one comprehension: the first tick passes ~100,000 ids).
    starts = [0, *(k for k in range(1, len(ids)) if ids[k] != ids[k - 1] + 1), len(ids)]
    for first, end in itertools.pairwise(starts):
        if end - first >= min_range:
            ranges.append((ids[first], ids[end - 1]))
        else:
            singles.extend(ids[first:end])
    return ranges, singles


def in_chunks(ids: list[int], size: int = IN_CHUNK) -> list[list[int]]:
    """``ids`` in lists of at most ``size`` (one IN list each)."""
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _check_columns(table: Table, columns: Iterable[str]) -> None:
    unknown = [c for c in columns if c not in table.c]
    if unknown:
        raise ValueError(f"no column {', '.join(unknown)} in {table.name}")
