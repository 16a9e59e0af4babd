"""A lock per key while it is used (hf3fs.keyed_locks), and the client's per-inode order of appenders built on it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from hf3fs.fs.sessions import WriteSessions
from hf3fs.keyed_locks import KeyedLocks


def test_a_key_holds_a_lock_only_while_it_is_used_and_a_waiter_keeps_others_out() -> None:
    locks = KeyedLocks()
    for key in range(1000):
        with locks.hold(key):
            assert len(locks) == 1
    assert len(locks) == 0
    inside: list[str] = []
    b_in, b_out = threading.Event(), threading.Event()

    def user(name: str, entered: threading.Event | None = None, leave: threading.Event | None = None) -> None:
        with locks.hold("k"):
            inside.append(name)
            if entered is not None and leave is not None:
                entered.set()
                leave.wait(10)
            inside.remove(name)

    b = threading.Thread(target=user, args=("b", b_in, b_out))
    with locks.hold("k"):
        b.start()
        time.sleep(0.1)  # b waits for the lock held here
    assert b_in.wait(10)
    c = threading.Thread(target=user, args=("c",))
    c.start()
    time.sleep(0.1)
    assert inside == ["b"]  # c waits while b holds it
    b_out.set()
    b.join(10)
    c.join(10)
    assert inside == [] and len(locks) == 0


def test_the_clients_appends_keep_no_lock_per_file_once_done() -> None:
    """The client's one-appender-per-inode guard ("ab" files) kept a lock for every file it ever appended to: a
    long-lived process appending to ever new files (a log per step) grew by one per file."""
    meta_call: Any = None
    no_loop: Any = SimpleNamespace(run=lambda coro: coro.close())  # no renewer: nothing here needs meta
    sessions = WriteSessions(no_loop, meta_call, None)
    for inode_id in range(1000):
        with sessions.append_guard(inode_id):
            pass
    assert len(sessions._append_locks) == 0
