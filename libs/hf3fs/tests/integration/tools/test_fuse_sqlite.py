"""SQLite on the real mount (issue 16): two processes x 20 transactions x 100 rows with ``BEGIN IMMEDIATE``, in
rollback-journal (delete) and WAL mode, with one connection per process and with a new connection per
transaction: ``integrity_check`` ok and exactly 4,000 rows. Locks: the mount registers no FUSE lock handlers, so
the kernel keeps POSIX (fcntl) and flock locks itself, among the processes of this machine (one mount)."""

from __future__ import annotations

import itertools
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from .test_fuse_mount import _skip_reason, mount  # noqa: F401  (the mount fixture)

# What the test needs is the database changing hands between the two processes (the lock passing, the other process
# then reading what the first wrote): a handoff, counted in rowid order. With the workers starting together and
# thinking between transactions (below), 30-38 handoffs were counted in every mode at 20 transactions each (before
# either, 1-2 with one connection, 12-45 with one per transaction). Fewer than MIN_HANDOFFS fails the test, so a
# change cannot quietly stop interleaving them.
WORKERS, TRANSACTIONS, ROWS = 2, 20, 100
MIN_HANDOFFS = 3


# Each worker is a separate Python process (sqlite3 only, nothing of this package), as two programs would be.
# They start their transactions together (a worker's interpreter can take seconds to start on a loaded machine, long
# enough for the other to finish alone): each says it is ready on stdout and waits for a line on stdin. Between
# transactions a worker does other work for 0-50 ms, as a program would: without it the lock's holder takes it again
# at once while the other sleeps in SQLite's busy handler (up to 100 ms a time), and the lock never changes hands.
WORKER = """
import random, sqlite3, sys, time
db, worker, per_transaction = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
transactions, rows = int(sys.argv[4]), int(sys.argv[5])
think = random.Random(worker)
print("ready", flush=True)
sys.stdin.readline()
conn = None
for t in range(transactions):
    if conn is None or per_transaction:
        if conn is not None:
            conn.close()
        conn = sqlite3.connect(db, timeout=120, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany("INSERT INTO t (worker, seq, payload) VALUES (?, ?, ?)",
                     [(worker, t * rows + k, f"row {worker}/{t}/{k}") for k in range(rows)])
    conn.execute("COMMIT")
    time.sleep(think.uniform(0, 0.05))
conn.close()
"""


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
@pytest.mark.parametrize("connection_per_transaction", [False, True], ids=["one-connection", "per-transaction"])
def test_two_processes_commit_every_row(
    mount: Path,  # noqa: F811
    journal_mode: str,
    connection_per_transaction: bool,
) -> None:
    folder = mount / "sqlite"
    folder.mkdir(exist_ok=True)
    db = folder / f"{journal_mode}-{int(connection_per_transaction)}.db"
    setup = sqlite3.connect(db, isolation_level=None)
    assert setup.execute(f"PRAGMA journal_mode={journal_mode}").fetchone()[0] == journal_mode
    setup.execute("CREATE TABLE t (worker INTEGER, seq INTEGER, payload TEXT)")
    setup.close()
    flag = "1" if connection_per_transaction else "0"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(db), str(w), flag, str(TRANSACTIONS), str(ROWS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(WORKERS)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    errors = [p.communicate(timeout=800)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORKERS, errors
    check = sqlite3.connect(db)
    assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert check.execute("SELECT COUNT(*) FROM t").fetchone() == (WORKERS * TRANSACTIONS * ROWS,)
    per_worker = check.execute("SELECT worker, COUNT(DISTINCT seq) FROM t GROUP BY worker ORDER BY worker").fetchall()
    assert per_worker == [(w, TRANSACTIONS * ROWS) for w in range(WORKERS)]
    order = [w for (w,) in check.execute("SELECT worker FROM t ORDER BY rowid")]
    handoffs = sum(a != b for a, b in itertools.pairwise(order))
    assert handoffs >= MIN_HANDOFFS, f"the lock changed hands {handoffs} times"
    check.close()
