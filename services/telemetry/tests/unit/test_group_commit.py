"""Group commit in its writer thread, with a fake write: groups form while a write runs, at most the size
limit each, every caller gets its own answer, and close writes what is queued before it stops."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ff_telemetry.store.group_commit import GroupCommitter


class FakeWrite:
    """Records the groups; the first write waits for ``release`` (so others queue up behind it)."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list[int]) -> list[str | Exception]:
        self.started.set()
        self.release.wait(timeout=10)
        self.groups.append(items)
        if -1 in items:
            raise OSError("disk full")
        return [ValueError(f"bad {i}") if i < 0 else f"stored {i}" for i in items]


async def test_items_queued_during_a_write_go_together_within_the_size_limit() -> None:
    write = FakeWrite()
    committer: GroupCommitter[int, str] = GroupCommitter(write, size_of=abs, max_group_size=10)
    first = asyncio.create_task(committer.submit(1))
    await asyncio.to_thread(write.started.wait, 10)  # the thread writes [1] and waits
    rest = [asyncio.create_task(committer.submit(i)) for i in (2, 3, -4, 5, 6)]
    await asyncio.sleep(0)  # the tasks queue their items
    write.release.set()
    answers = await asyncio.gather(first, *rest, return_exceptions=True)
    assert [str(a) for a in answers] == ["stored 1", "stored 2", "stored 3", "bad -4", "stored 5", "stored 6"]
    assert isinstance(answers[3], ValueError)
    # Queued while [1] was written: 2 + 3 + 4 fit in 10, 5 would not, nor 5 + 6.
    assert write.groups == [[1], [2, 3, -4], [5], [6]]
    committer.close()


async def test_a_failed_write_is_every_callers_answer_and_close_drains_the_queue() -> None:
    write = FakeWrite()
    write.release.set()
    committer: GroupCommitter[int, str] = GroupCommitter(write, size_of=lambda i: 1, max_group_size=100)
    results = await asyncio.gather(committer.submit(-1), return_exceptions=True)
    assert isinstance(results[0], OSError)
    assert await committer.submit(7) == "stored 7"  # the thread goes on after a failed group
    committer.close()
    with pytest.raises(RuntimeError, match="closed"):
        await committer.submit(8)
    assert [i for g in write.groups for i in g] == [-1, 7]
