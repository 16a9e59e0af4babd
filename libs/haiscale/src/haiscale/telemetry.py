"""haiscale's own metrics in the task's telemetry: step time, allreduce time and bytes, checkpoint times.

Sent with ``hfai.telemetry.report`` (buffered and pushed by a background thread, never blocking or failing a
step; nothing is sent outside a configured cluster), so they carry the task, run and rank labels the agent
gives every rank. Per-step figures are summed in memory and reported once per ``REPORT_INTERVAL_S`` as
averages over the steps in between (``hfai_ddp_steps`` says how many), so a step costs a few additions:

- ``hfai_ddp_step_seconds``: wall time from one reduced forward to the next (one optimizer step, however
  many ``no_sync`` micro-batches it accumulates);
- ``hfai_ddp_allreduce_wait_seconds``: how long the end of backward waited for buckets still in flight (the
  communication the overlap did not hide);
- ``hfai_ddp_allreduce_bytes``: gradient bytes reduced per step; ``hfai_ddp_wire_bytes``: bytes this rank sent
  and received between nodes per step (hfreduce's counters);
- ``hfai_checkpoint_snapshot_seconds`` (the part of ``save`` the caller waits for), ``..._save_seconds`` (the
  background write and, on rank 0, the commit), ``..._save_bytes``, ``..._load_seconds``: one sample per event.

``HAISCALE_TELEMETRY=0`` turns all of it off.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

REPORT_INTERVAL_S = 5.0
ENV_SWITCH = "HAISCALE_TELEMETRY"

Sink = Callable[..., None]


def default_sink() -> Sink | None:
    """``hfai.telemetry.report``, or None when switched off (``HAISCALE_TELEMETRY=0``)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    try:
        from hfai import telemetry
    except ImportError:  # (a dependency, but a broken install must not stop training)
        logger.warning("haiscale telemetry: hfai.telemetry cannot be imported; nothing is reported", exc_info=True)
        return None
    report: Sink = telemetry.report
    return report


def send(sink: Sink | None, **metrics: float) -> None:
    """Report ``metrics`` (without the ``hfai_`` prefix ``report`` adds); a failing sink is logged, never raised.

    Telemetry must not fail a training step or a checkpoint. A ``None`` sink (reporting off) does nothing.
    """
    if sink is None:
        return
    try:
        sink(**metrics)
    except Exception:
        logger.warning("haiscale telemetry: report failed", exc_info=True)


class StepMetrics:
    """Sums of one reducer's steps, reported every ``interval_s`` (checked at each step's start)."""

    def __init__(
        self,
        sink: Sink | None,
        interval_s: float = REPORT_INTERVAL_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._sink = sink
        self._interval_s = interval_s
        self._clock = clock
        self._step_started: float | None = None
        self._reduced = False  # a reduced backward since the step started
        self._wait_s = 0.0
        self._bytes = 0
        self._wire = 0
        self._steps = 0
        self._sum_step_s = 0.0
        self._sum_wait_s = 0.0
        self._sum_bytes = 0
        self._sum_wire = 0
        self._last_report = clock()

    @property
    def enabled(self) -> bool:
        """Whether there is a sink to report to; without one, callers may skip measuring."""
        return self._sink is not None

    def step_started(self) -> None:
        """A forward whose backward will be reduced starts: closes the previous step if it was reduced."""
        now = self._clock()
        if self._step_started is not None and self._reduced:
            self._steps += 1
            self._sum_step_s += now - self._step_started
            self._sum_wait_s += self._wait_s
            self._sum_bytes += self._bytes
            self._sum_wire += self._wire
            if now - self._last_report >= self._interval_s:
                self.flush(now)
        self._step_started = now
        self._reduced = False
        self._wait_s, self._bytes, self._wire = 0.0, 0, 0

    def reduced(self, wait_s: float, reduced_bytes: int, wire_bytes: int) -> None:
        """The step's backward reduced ``reduced_bytes`` of gradients, waiting ``wait_s`` at its end."""
        self._reduced = True
        self._wait_s += wait_s
        self._bytes += reduced_bytes
        self._wire += wire_bytes

    def flush(self, now: float | None = None) -> None:
        """Report the averages of the steps closed since the last report (nothing if none closed)."""
        self._last_report = self._clock() if now is None else now
        if not self._steps:
            return
        n = self._steps
        send(
            self._sink,
            ddp_steps=n,
            ddp_step_seconds=self._sum_step_s / n,
            ddp_allreduce_wait_seconds=self._sum_wait_s / n,
            ddp_allreduce_bytes=self._sum_bytes / n,
            ddp_wire_bytes=self._sum_wire / n,
        )
        self._steps, self._sum_step_s, self._sum_wait_s, self._sum_bytes, self._sum_wire = 0, 0.0, 0.0, 0, 0
