"""The run-control contract between the SDK and an agent (real files). (Parsing without a run: ``unit/``.)"""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from hfai import client, runcontrol
from hfai.runcontrol import RunControl


def test_suspend_flag_and_events_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = RunControl(tmp_path).create()
    monkeypatch.setenv(runcontrol.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(client, "_state", {})
    assert client.receive_suspend_command() is False
    agent.raise_suspend()
    assert client.receive_suspend_command() is True
    assert client.receive_suspend_command() is True  # acknowledged once
    client.set_watchdog_time(600)
    client.report_checkpoint("/3fs/ckpt", step=3)
    taken_at = time.time()
    client.report_checkpoint("/3fs/ckpt2", step=4, taken_at=taken_at)
    with pytest.raises(ValueError, match="taken_at"):
        client.report_checkpoint("/3fs/ckpt3", step=5, taken_at=float("nan"))
    events = agent.new_events()
    assert [(e.kind, e.data) for e in events] == [
        ("received", {}),
        ("watchdog_time", {"seconds": 600.0}),
        ("checkpoint", {"path": "/3fs/ckpt", "step": 3, "taken_at": 0.0}),  # not told: it cannot end a suspend
        ("checkpoint", {"path": "/3fs/ckpt2", "step": 4, "taken_at": taken_at}),
    ]
    # When rank 0 read the flag, on this clock: what a checkpoint's taken_at is compared with.
    assert events[0].written_at <= taken_at <= time.time()
    assert agent.new_events() == []


def test_only_rank0_sees_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    RunControl(tmp_path).create().raise_suspend()
    monkeypatch.setenv(runcontrol.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    assert client.receive_suspend_command() is False


def test_whole_life_state_waits_for_the_agent_and_is_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = RunControl(tmp_path).create()
    monkeypatch.setenv(runcontrol.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(client.WHOLE_LIFE_STATE_ENV, "5")
    monkeypatch.setattr(client, "_state", {})
    monkeypatch.setattr(client, "ACK_TIMEOUT_S", 0.2)
    assert client.get_whole_life_state() == 5
    with pytest.raises(TimeoutError):
        client.set_whole_life_state(8)  # nobody acknowledged it
    assert client.get_whole_life_state() == 5  # not stored: unchanged
    monkeypatch.setattr(client, "ACK_TIMEOUT_S", 5.0)
    relay = threading.Thread(target=_ack_next, args=(agent,))
    relay.start()
    client.set_whole_life_state(9)
    relay.join()
    assert client.get_whole_life_state() == 9


def _ack_next(agent: RunControl) -> None:
    """An agent: wait for the next whole_life_state event and acknowledge it."""
    while True:
        events = [e for e in agent.new_events() if e.kind == "whole_life_state" and e.data["value"] == 9]
        if events:
            agent.ack(events[0].seq)
            return
        time.sleep(0.01)


def _line(**fields: Any) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def test_the_agent_side_drops_events_the_sdk_never_writes_and_reads_on(tmp_path: Path) -> None:
    """A rank may write anything to its events file: what the SDK would not write is dropped (the agent would fail
    to relay it, every tick, and relay nothing after it), and the events after it still come."""
    agent = RunControl(tmp_path).create()
    hostile = [
        b"not json\n",
        b"[1, 2]\n",
        _line(seq="1", kind="received"),
        _line(seq=2**64, kind="received"),
        _line(seq=5, kind=7),
        _line(seq=6, kind="checkpoint", path="/3fs/c", step=2**70, taken_at=0.0),
        _line(seq=7, kind="checkpoint", path="/3fs/" + "x" * 5000, step=1),
        _line(seq=8, kind="checkpoint", path=["/3fs/c"], step=1),
        b'{"seq": 9, "kind": "checkpoint", "path": "/3fs/c", "step": 1, "taken_at": NaN}\n',
        _line(seq=10, kind="whole_life_state", value=2**64),
        _line(seq=11, kind="whole_life_state", value="1"),
        b'{"seq": 12, "kind": "watchdog_time", "seconds": Infinity}\n',
        _line(seq=13, kind="watchdog_time", seconds=-1),
        b"[" * 100000 + b"\n",  # too deep for the JSON parser, and longer than any event
    ]
    good = [
        _line(seq=20, kind="checkpoint", path="/3fs/c", step=-3, taken_at=1.5),
        _line(seq=21, kind="whole_life_state", value=-(2**63)),
        _line(seq=22, kind="go_suspend"),
    ]
    (tmp_path / runcontrol.EVENTS_FILE).write_bytes(b"".join(hostile + good))
    events = agent.new_events()
    assert [(e.seq, e.kind, e.data) for e in events] == [
        (20, "checkpoint", {"path": "/3fs/c", "step": -3, "taken_at": 1.5}),
        (21, "whole_life_state", {"value": -(2**63)}),
        (22, "go_suspend", {}),
    ]
    assert agent.new_events() == []


def test_an_events_file_of_gigabytes_is_read_in_bounded_pieces(tmp_path: Path) -> None:
    """A line of 64 MiB (or a sparse file of a terabyte) is skipped without holding it in memory; the events
    after it come."""
    agent = RunControl(tmp_path).create()
    path = tmp_path / runcontrol.EVENTS_FILE
    with path.open("wb") as f:
        f.write(_line(seq=1, kind="received"))
        f.write(b"x" * (64 << 20) + b"\n")
        f.write(_line(seq=2, kind="go_suspend"))
    tracemalloc.start()
    try:
        seen: list[runcontrol.Event] = []
        for _ in range(100):  # a bounded amount read per call: the agent calls once a tick
            seen += agent.new_events()
            if len(seen) == 2:
                break
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(e.seq, e.kind) for e in seen] == [(1, "received"), (2, "go_suspend")]
    assert peak < 20 << 20, peak
    with path.open("r+b") as f:
        f.truncate(1 << 40)  # sparse: no disk; read whole it would be a terabyte of memory
    started = time.monotonic()
    assert agent.new_events() == []
    assert time.monotonic() - started < 5


def test_the_sdk_refuses_a_checkpoint_report_the_agent_could_not_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    RunControl(tmp_path).create()
    monkeypatch.setenv(runcontrol.RUN_DIR_ENV, str(tmp_path))
    with pytest.raises(ValueError, match=r"step must be a 64-bit integer"):
        client.report_checkpoint("/3fs/c", step=2**70)
    with pytest.raises(ValueError, match=r"path must be a string of 1 to 4096 characters"):
        client.report_checkpoint("/3fs/" + "x" * 5000, step=1)
    with pytest.raises(ValueError, match=r"the watchdog time must be a finite number > 0"):
        client.set_watchdog_time(float("inf"))
    assert not (tmp_path / runcontrol.EVENTS_FILE).exists()  # nothing was written
