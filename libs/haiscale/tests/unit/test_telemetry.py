"""haiscale's step metrics: averaged over the steps between reports, only reduced steps counted."""

from __future__ import annotations

from typing import Any

import pytest

from ff_testing.fakes import FakeClock
from haiscale.telemetry import StepMetrics, default_sink, send

pytestmark = pytest.mark.unit


def test_steps_are_averaged_and_reported_once_per_interval() -> None:
    sent: list[dict[str, float]] = []
    clock = FakeClock()
    m = StepMetrics(lambda **kw: sent.append(kw), interval_s=5.0, clock=clock)
    for i in range(4):  # steps of 1 s, 2 s, 1 s (the fourth is still open)
        clock.now = [0.0, 1.0, 3.0, 4.0][i]
        m.step_started()
        m.reduced(wait_s=0.1 * (i + 1), reduced_bytes=1000, wire_bytes=500)
    assert sent == []  # 4 s since the start: not yet
    clock.now = 6.0
    m.step_started()  # closes the fourth step (2 s): 4 closed steps, 6 s since the last report
    assert sent == [
        {
            "ddp_steps": 4,
            "ddp_step_seconds": 1.5,
            "ddp_allreduce_wait_seconds": pytest.approx(0.25),
            "ddp_allreduce_bytes": 1000,
            "ddp_wire_bytes": 500,
        }
    ]
    m.flush()
    assert len(sent) == 1  # nothing closed since


def test_a_step_without_a_reduced_backward_is_not_a_step() -> None:
    sent: list[dict[str, float]] = []
    clock = FakeClock()
    m = StepMetrics(lambda **kw: sent.append(kw), interval_s=0.0, clock=clock)
    m.step_started()
    clock.now = 1.0
    m.step_started()  # the first forward had no reduced backward (evaluation, or a crash): not counted
    assert sent == []
    m.reduced(wait_s=0.0, reduced_bytes=8, wire_bytes=0)
    m.reduced(wait_s=0.5, reduced_bytes=8, wire_bytes=0)  # two reduced backwards in one step add up
    clock.now = 3.0
    m.step_started()
    assert sent == [
        {
            "ddp_steps": 1,
            "ddp_step_seconds": 2.0,
            "ddp_allreduce_wait_seconds": 0.5,
            "ddp_allreduce_bytes": 16,
            "ddp_wire_bytes": 0,
        }
    ]


def test_a_failing_sink_never_raises_and_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**kw: Any) -> None:
        raise RuntimeError("telemetry down")

    send(broken, x=1.0)  # logged, not raised
    monkeypatch.setenv("HAISCALE_TELEMETRY", "0")
    assert default_sink() is None and not StepMetrics(default_sink()).enabled
    monkeypatch.delenv("HAISCALE_TELEMETRY")
    assert default_sink() is not None
