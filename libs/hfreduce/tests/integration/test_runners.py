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

from hfreduce.runners import MAX_TASKS, EventLoop, Handoff, Runner, Task, ThreadRunner, Until
from hfreduce.transport import Link, LinkError

LONG_S = 10.0  # runs that must succeed: generous, CI machines are slow and shared
SHORT_S = 0.5  # runs that must time out
BIG = 8 << 20  # several times the socket buffers: neither side's send finishes before the other receives

Pair = tuple[Link, Link]


def make_pair(timeout_s: float) -> Pair:
    a, b = socket.socketpair()
    return Link(a, peer=1, timeout_s=timeout_s), Link(b, peer=0, timeout_s=timeout_s)


@pytest.fixture(params=["loop", "threads"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Rig:
    """A runner of one kind over a socket pair; a failure shuts the pair down, as a group shuts its links."""

    def __init__(self, kind: str, timeout_s: float) -> None:
        self.pair = make_pair(timeout_s)
        self.failures = 0
        self.runner: Runner = (EventLoop if kind == "loop" else ThreadRunner)(timeout_s, self._on_failure)

    def _on_failure(self) -> None:
        self.failures += 1
        for link in self.pair:
            link.abort()

    def close(self) -> None:
        self.runner.close()
        for link in self.pair:
            link.close()


@pytest.fixture
def rig(kind: str) -> Iterator[Rig]:
    made = Rig(kind, LONG_S)
    yield made
    made.close()


@pytest.fixture
def short(kind: str) -> Iterator[Rig]:
    made = Rig(kind, SHORT_S)
    yield made
    made.close()


def send(runner: Runner, link: Link, data: bytes) -> Task:
    yield from runner.send(link, memoryview(data))
    return len(data)


def recv(runner: Runner, link: Link, nbytes: int) -> Task:
    buf = bytearray(nbytes)
    yield from runner.recv(link, memoryview(buf))
    return bytes(buf)


def test_both_directions_at_once_move_every_byte(rig: Rig) -> None:
    (left, right), run = rig.pair, rig.runner
    rng = np.random.default_rng(7)
    x, y = rng.bytes(BIG), rng.bytes(BIG + 13)
    tasks = [send(run, left, x), send(run, right, y), recv(run, left, len(y)), recv(run, right, len(x))]
    assert run.run(tasks) == [len(x), len(y), y, x]
    assert rig.failures == 0


def test_the_same_runner_runs_again_on_the_same_sockets(rig: Rig) -> None:
    (left, right), run = rig.pair, rig.runner
    for i in range(3):
        data = bytes([i]) * (BIG // 4)
        assert run.run([recv(run, right, len(data)), send(run, left, data)]) == [data, len(data)]


def test_a_loop_serves_new_sockets_under_old_numbers() -> None:
    loop = EventLoop(LONG_S)
    try:
        for _ in range(3):  # each new pair likely reuses the closed pair's descriptor numbers
            left, right = make_pair(LONG_S)
            data = b"z" * (BIG // 4)
            assert loop.run([recv(loop, right, len(data)), send(loop, left, data)]) == [data, len(data)]
            left.close()
            right.close()
    finally:
        loop.close()


def test_small_messages_run_in_order(rig: Rig) -> None:
    (left, right), run = rig.pair, rig.runner
    assert run.run([send(run, left, b"x" * 1000), recv(run, right, 1000)], in_order=True) == [1000, b"x" * 1000]


def test_a_handoff_passes_every_item_in_order(rig: Rig) -> None:
    handoff, run = Handoff(), rig.runner

    def producer() -> Task:
        for i in range(50):
            handoff.put(i)
            if i % 7 == 0:  # threads: give the consumer time to drain and wait on an empty hand-off
                time.sleep(0.002)
        return "done"
        yield

    def consumer() -> Task:
        got = []
        for _ in range(50):
            got.append((yield from run.take(handoff, "producer")))
        return got

    assert run.run([consumer(), producer()]) == [list(range(50)), "done"]


def test_on_a_loop_a_consumer_waits_and_resumes_for_each_item() -> None:
    loop, handoff, waits = EventLoop(LONG_S), Handoff(), []

    def producer() -> Task:
        for i in range(20):
            handoff.put(i)
            yield Until(lambda: not handoff.ready(), "consumer")  # let it take this one first
        return "done"

    def consumer() -> Task:
        got = []
        for _ in range(20):
            waits.append(not handoff.ready())
            got.append((yield from loop.take(handoff, "producer")))
        return got

    try:
        assert loop.run([consumer(), producer()]) == [list(range(20)), "done"]
    finally:
        loop.close()
    assert all(waits)  # every item was waited for, not found already there


def test_a_silent_peer_times_out_naming_it(short: Rig) -> None:
    (left, _), run = short.pair, short.runner
    start = time.monotonic()
    with pytest.raises(LinkError) as info:
        run.run([recv(run, left, 10)])
    assert info.value.kind == "timeout" and info.value.peer == 1
    assert SHORT_S * 0.9 <= time.monotonic() - start < SHORT_S + 2.0
    assert short.failures == 1


def test_a_silent_peer_times_out_while_another_task_keeps_progressing(kind: str) -> None:
    busy = Rig(kind, SHORT_S)
    silent_left, silent_right = make_pair(SHORT_S)
    run, (left, right) = busy.runner, busy.pair

    def feed() -> None:  # another process's sends: a byte every 20 ms for 3 s, far past the timeout
        for _ in range(150):
            try:
                left.sock.send(b"t")
            except OSError:  # the runner shut the pair down when the silent peer timed out
                return
            time.sleep(0.02)

    def trickle() -> Task:  # each byte wakes the runner: this task keeps progressing
        for _ in range(150):
            yield from run.recv(right, memoryview(bytearray(1)))

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    start = time.monotonic()
    try:
        with pytest.raises(LinkError) as info:
            run.run([trickle(), recv(run, silent_left, 10)])
        assert info.value.kind == "timeout" and info.value.peer == 1
        assert time.monotonic() - start < SHORT_S + 1.5
    finally:
        busy.close()
        feeder.join(timeout=5)
        silent_left.close()
        silent_right.close()


def test_a_full_peer_that_never_reads_times_out_the_sender(short: Rig) -> None:
    (_, right), run = short.pair, short.runner
    with pytest.raises(LinkError) as info:
        run.run([send(run, right, bytes(BIG))])
    assert info.value.kind == "timeout" and info.value.peer == 0


def test_a_handoff_never_made_times_out_naming_it(short: Rig) -> None:
    run = short.runner

    def forever() -> Task:
        yield from run.take(Handoff(), "reduce of chunk (0, 4)")

    with pytest.raises(TimeoutError, match=r"reduce of chunk \(0, 4\) not done within 0.5 s"):
        run.run([forever()])


@pytest.mark.parametrize("event", ["the peer closes", "an abort from another thread"])
def test_a_link_ending_while_waited_on_wakes_the_runner_at_once(rig: Rig, event: str) -> None:
    (left, right), run = rig.pair, rig.runner
    timer = threading.Timer(0.2, right.close if event == "the peer closes" else left.abort)
    timer.start()
    start = time.monotonic()
    with pytest.raises(LinkError) as info:
        run.run([recv(run, left, 10)])
    timer.join()
    assert info.value.kind == "closed" and info.value.peer == 1
    assert time.monotonic() - start < LONG_S / 2


def test_any_failure_stops_every_other_task_shuts_the_links_and_is_raised(rig: Rig) -> None:
    (left, _), run = rig.pair, rig.runner
    stopped: list[str] = []
    receiving = threading.Event()

    def waiting() -> Task:
        try:
            receiving.set()
            yield from run.recv(left, memoryview(bytearray(10)))
        finally:
            stopped.append("waiting")

    def failing() -> Task:
        # The other task is at its receive (on a loop it ran first, up to where it parked; on threads it is there
        # or about to be: a receive on links already shut fails as well).
        assert receiving.wait(LONG_S / 4), "the waiting task never began its receive"
        raise ValueError("bad chunk")
        yield

    start = time.monotonic()
    with pytest.raises(ValueError, match="bad chunk"):
        run.run([waiting(), failing()])
    assert stopped == ["waiting"]
    assert rig.failures >= 1  # the links were shut: a half-sent chunk must not meet the next collective
    assert time.monotonic() - start < LONG_S / 2  # not left to time out


def test_two_tasks_receiving_on_one_link_is_refused_on_a_loop() -> None:
    loop = EventLoop(LONG_S)
    left, right = make_pair(LONG_S)
    try:
        with pytest.raises(RuntimeError, match="two tasks wait to receive on one link"):
            loop.run([recv(loop, left, 10), recv(loop, left, 10)])
    finally:
        loop.close()
        left.close()
        right.close()


def test_a_thread_runner_refuses_more_tasks_than_threads_and_tasks_that_wait() -> None:
    threads = ThreadRunner(LONG_S, lambda: None)

    def idle() -> Task:
        return None
        yield

    def confused() -> Task:
        yield Until(lambda: True, "nothing")

    try:
        with pytest.raises(ValueError, match=f"at most {MAX_TASKS} tasks"):
            threads.run([idle() for _ in range(MAX_TASKS + 1)])
        with pytest.raises(RuntimeError, match="blocks instead"):
            threads.run([confused()])
    finally:
        threads.close()
