"""Both pipeline runners over real socket pairs: concurrent sends and receives larger than the kernel's
buffers, hand-offs between tasks, and every way a wait ends badly (silence, a closed peer, an abort from
another thread, a failing task)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from hfreduce.runners import EventLoop, Handoff, Runner, Task, ThreadRunner, Until
from hfreduce.transport import Link, LinkError

TIMEOUT_S = 0.5
BIG = 8 << 20  # several times the socket buffers: neither side's send finishes before the other receives


@pytest.fixture
def pair() -> Iterator[tuple[Link, Link]]:
    a, b = socket.socketpair()
    left, right = Link(a, peer=1, timeout_s=TIMEOUT_S), Link(b, peer=0, timeout_s=TIMEOUT_S)
    yield left, right
    left.close()
    right.close()


@pytest.fixture(params=["loop", "threads"])
def runner(request: pytest.FixtureRequest, pair: tuple[Link, Link]) -> Iterator[Runner]:
    """Each runner; on a failure the thread runner shuts the pair down, as a group shuts its links."""
    made: Runner = (
        EventLoop(TIMEOUT_S) if request.param == "loop" else ThreadRunner(TIMEOUT_S, lambda: [x.abort() for x in pair])
    )
    yield made
    made.close()


def send(runner: Runner, link: Link, data: bytes) -> Task:
    yield from runner.send(link, memoryview(data))
    return len(data)


def recv(runner: Runner, link: Link, nbytes: int) -> Task:
    buf = bytearray(nbytes)
    yield from runner.recv(link, memoryview(buf))
    return bytes(buf)


def test_both_directions_at_once_move_every_byte(pair: tuple[Link, Link], runner: Runner) -> None:
    left, right = pair
    rng = np.random.default_rng(7)
    x, y = rng.bytes(BIG), rng.bytes(BIG + 13)
    tasks = [send(runner, left, x), send(runner, right, y), recv(runner, left, len(y)), recv(runner, right, len(x))]
    assert runner.run(tasks) == [len(x), len(y), y, x]


def test_the_same_runner_runs_again_on_the_same_sockets(pair: tuple[Link, Link], runner: Runner) -> None:
    left, right = pair
    for i in range(3):
        data = bytes([i]) * (BIG // 4)
        assert runner.run([recv(runner, right, len(data)), send(runner, left, data)]) == [data, len(data)]


def test_small_messages_run_in_order(pair: tuple[Link, Link], runner: Runner) -> None:
    left, right = pair
    assert runner.run([send(runner, left, b"x" * 1000), recv(runner, right, 1000)], in_order=True) == [
        1000,
        b"x" * 1000,
    ]


def test_a_handoff_passes_every_item_in_order(runner: Runner) -> None:
    handoff = Handoff()

    def producer() -> Task:
        for i in range(50):
            handoff.put(i)
            if i % 7 == 0:  # give the consumer a chance to wait on an empty hand-off
                yield from ()
                time.sleep(0.001)
        return "done"

    def consumer() -> Task:
        got = []
        for _ in range(50):
            got.append((yield from runner.take(handoff, "producer")))
        return got

    assert runner.run([consumer(), producer()]) == [list(range(50)), "done"]


def test_a_silent_peer_times_out_naming_it(pair: tuple[Link, Link], runner: Runner) -> None:
    left, _ = pair
    start = time.monotonic()
    with pytest.raises(LinkError) as info:
        runner.run([recv(runner, left, 10)])
    assert info.value.kind == "timeout" and info.value.peer == 1
    assert TIMEOUT_S * 0.9 <= time.monotonic() - start < TIMEOUT_S + 1.0


def test_a_full_peer_that_never_reads_times_out_the_sender(pair: tuple[Link, Link], runner: Runner) -> None:
    _, right = pair
    with pytest.raises(LinkError) as info:
        runner.run([send(runner, right, bytes(BIG))])
    assert info.value.kind == "timeout" and info.value.peer == 0


def test_a_handoff_never_made_times_out_naming_it(runner: Runner) -> None:
    def forever() -> Task:
        yield from runner.take(Handoff(), "reduce of chunk (0, 4)")

    with pytest.raises(TimeoutError, match=r"reduce of chunk \(0, 4\) not done within 0.5 s"):
        runner.run([forever()])


def test_a_closed_peer_fails_the_receiver(pair: tuple[Link, Link], runner: Runner) -> None:
    left, right = pair
    right.close()
    with pytest.raises(LinkError) as info:
        runner.run([recv(runner, left, 10)])
    assert info.value.kind == "closed" and info.value.peer == 1


def test_an_abort_from_another_thread_wakes_the_runner_at_once(pair: tuple[Link, Link], runner: Runner) -> None:
    left, _ = pair
    timer = threading.Timer(0.1, left.abort)
    timer.start()
    start = time.monotonic()
    with pytest.raises(LinkError) as info:
        runner.run([recv(runner, left, 10)])
    timer.join()
    assert info.value.kind == "closed"
    assert time.monotonic() - start < TIMEOUT_S


def test_the_first_failure_stops_every_other_task_and_is_raised(pair: tuple[Link, Link], runner: Runner) -> None:
    left, _ = pair
    stopped: list[str] = []

    def waiting() -> Task:
        try:
            yield from runner.recv(left, memoryview(bytearray(10)))
        finally:
            stopped.append("waiting")

    def failing() -> Task:
        yield from ()
        time.sleep(0.05)  # the other task is blocked or parked on its receive by now
        raise ValueError("bad chunk")

    start = time.monotonic()
    with pytest.raises(ValueError, match="bad chunk"):
        runner.run([waiting(), failing()])
    assert stopped == ["waiting"]
    assert time.monotonic() - start < TIMEOUT_S  # not left to time out


def test_a_thread_runner_task_must_not_wait_on_the_loop() -> None:
    threads = ThreadRunner(TIMEOUT_S, lambda: None)

    def confused() -> Task:
        yield Until(lambda: True, "nothing")

    with pytest.raises(RuntimeError, match="blocks instead"):
        threads.run([confused()])
    threads.close()
