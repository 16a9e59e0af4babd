"""The pipeline's event loop over real socket pairs: concurrent sends and receives larger than the kernel's
buffers, conditions between tasks, and every way a wait ends badly (silence, a closed peer, an abort from
another thread, a failing task)."""

from __future__ import annotations

import collections
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from hfreduce.loop import EventLoop, Task, Until
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


@pytest.fixture
def loop() -> Iterator[EventLoop]:
    ev = EventLoop(TIMEOUT_S)
    yield ev
    ev.close()


def send(link: Link, data: bytes) -> Task:
    yield from link.send_steps(memoryview(data))
    return len(data)


def recv(link: Link, nbytes: int) -> Task:
    buf = bytearray(nbytes)
    yield from link.recv_steps(memoryview(buf))
    return bytes(buf)


def test_both_directions_at_once_move_every_byte(pair: tuple[Link, Link], loop: EventLoop) -> None:
    left, right = pair
    rng = np.random.default_rng(7)
    x, y = rng.bytes(BIG), rng.bytes(BIG + 13)
    results = loop.run([send(left, x), send(right, y), recv(left, len(y)), recv(right, len(x))])
    assert results == [len(x), len(y), y, x]


def test_the_same_loop_runs_again_on_the_same_sockets(pair: tuple[Link, Link], loop: EventLoop) -> None:
    left, right = pair
    for i in range(3):
        data = bytes([i]) * (BIG // 4)
        assert loop.run([recv(right, len(data)), send(left, data)]) == [data, len(data)]


def test_a_task_waiting_on_a_condition_resumes_when_another_meets_it(loop: EventLoop) -> None:
    box: collections.deque[int] = collections.deque()
    order: list[str] = []

    def producer() -> Task:
        for i in range(3):
            box.append(i)
            order.append(f"put {i}")
            yield Until(lambda: not box, "consumer")
        return "done"

    def consumer() -> Task:
        got = []
        while len(got) < 3:
            if not box:
                yield Until(lambda: bool(box), "producer")
            got.append(box.popleft())
            order.append(f"got {got[-1]}")
        return got

    assert loop.run([consumer(), producer()]) == [[0, 1, 2], "done"]
    assert order == ["put 0", "got 0", "put 1", "got 1", "put 2", "got 2"]


def test_a_silent_peer_times_out_naming_it(pair: tuple[Link, Link], loop: EventLoop) -> None:
    left, _ = pair
    start = time.monotonic()
    with pytest.raises(LinkError) as info:
        loop.run([recv(left, 10)])
    assert info.value.kind == "timeout" and info.value.peer == 1
    assert TIMEOUT_S <= time.monotonic() - start < TIMEOUT_S + 1.0


def test_a_full_peer_that_never_reads_times_out_the_sender(pair: tuple[Link, Link], loop: EventLoop) -> None:
    _, right = pair
    with pytest.raises(LinkError) as info:
        loop.run([send(right, bytes(BIG))])
    assert info.value.kind == "timeout" and info.value.peer == 0


def test_a_condition_never_met_times_out_naming_it(loop: EventLoop) -> None:
    def forever() -> Task:
        yield Until(lambda: False, "reduce of chunk (0, 4)")

    with pytest.raises(TimeoutError, match=r"reduce of chunk \(0, 4\) not done within 0.5 s"):
        loop.run([forever()])


def test_a_closed_peer_fails_the_receiver(pair: tuple[Link, Link], loop: EventLoop) -> None:
    left, right = pair
    right.close()
    with pytest.raises(LinkError) as info:
        loop.run([recv(left, 10)])
    assert info.value.kind == "closed" and info.value.peer == 1


def test_an_abort_from_another_thread_wakes_the_loop_at_once(pair: tuple[Link, Link], loop: EventLoop) -> None:
    left, _ = pair
    timer = threading.Timer(0.1, left.abort)
    timer.start()
    start = time.monotonic()
    with pytest.raises(LinkError) as info:
        loop.run([recv(left, 10)])
    timer.join()
    assert info.value.kind == "closed"
    assert time.monotonic() - start < TIMEOUT_S


def test_the_first_failure_closes_every_other_task(pair: tuple[Link, Link], loop: EventLoop) -> None:
    left, _ = pair
    closed: list[str] = []

    def waiting() -> Task:
        try:
            yield from left.recv_steps(memoryview(bytearray(10)))
        finally:
            closed.append("waiting")

    def failing() -> Task:
        yield Until(lambda: True, "nothing")
        raise ValueError("bad chunk")

    with pytest.raises(ValueError, match="bad chunk"):
        loop.run([waiting(), failing()])
    assert closed == ["waiting"]
