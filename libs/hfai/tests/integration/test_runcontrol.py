"""The run-control contract between the SDK and an agent (real files). (Parsing without a run: ``unit/``.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path

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
