"""The watch streams' wait for a routing change (``ff_mgmtd.app.wait_notified``) when the stream is cancelled just as
its wait times out: the routing lock must stay usable (with ``asyncio.wait_for`` around ``Condition.wait`` it did
not, and a primary stopped publishing routing changes and answering heartbeats; seen in a loaded test run)."""

from __future__ import annotations

import asyncio

import pytest

from ff_mgmtd.app import wait_notified


async def test_a_waiter_cancelled_while_it_takes_the_lock_back_after_its_timeout_leaves_the_lock_free() -> None:
    cond = asyncio.Condition()

    async def watcher() -> None:
        async with cond:
            await wait_notified(cond, 0.01)

    task = asyncio.create_task(watcher())
    await asyncio.sleep(0.005)  # it waits (the lock is free)
    async with cond:  # held past its timeout: after it, the waiter has to take the lock back from here
        await asyncio.sleep(0.05)
        task.cancel()  # the stream cancelled in the same step as the lock comes free (no await in between)
    with pytest.raises(asyncio.CancelledError):  # with wait_for: "RuntimeError: Lock is not acquired."
        await task
    await asyncio.sleep(0.01)  # whatever else was woken has run
    assert not cond.locked()
    async with asyncio.timeout(1):  # and the next publisher gets it
        async with cond:
            cond.notify_all()


async def test_a_notification_ends_the_wait_and_a_timeout_returns_quietly() -> None:
    cond = asyncio.Condition()
    woke = asyncio.Event()

    async def watcher() -> None:
        async with cond:
            await wait_notified(cond, 30)
        woke.set()

    task = asyncio.create_task(watcher())
    await asyncio.sleep(0.005)
    async with cond:
        cond.notify_all()
    async with asyncio.timeout(5):
        await woke.wait()
    await task
    async with cond:
        await wait_notified(cond, 0.01)  # nobody notifies: back after the timeout, the lock held
        assert cond.locked()
