"""Training metrics in one line: ``hfai.telemetry.report(step=i, loss=loss, tokens_per_s=tps)``.

Each keyword becomes the gauge ``hfai_<keyword>`` (``hfai_loss``, ``hfai_step``, ...), sampled at the
call. Inside a task the agent sets ``FF_TELEMETRY_LABELS`` for every rank (task_id, run_id, node_rank,
rank, local_rank, node): every sample carries them and the caller's ``labels`` cannot replace them; the
telemetry service adds ``user`` from the run's token. Samples are buffered and pushed by a background
thread (``ff_telemetry_client``): ``report`` never blocks on the network and never fails because telemetry
is down; what does not fit in the buffer is dropped and counted. NaN and infinite values are reported as
they are. Where no cluster is configured (``FF_MGMTD_ADDRESSES`` / ``HFAI_MGMTD``, or
``FF_TELEMETRY_ADDRESS``) ``report`` does nothing.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping

from ff_telemetry_client import BackgroundPusher, PushOptions, SampleBuffer
from hfai import config

logger = logging.getLogger(__name__)

LABELS_ENV = "FF_TELEMETRY_LABELS"
ADDRESS_ENV = "FF_TELEMETRY_ADDRESS"
METRIC_PREFIX = "hfai_"
FLUSH_INTERVAL_S = 1.0  # a loss reaches the task page within ~2.5 s (the page polls every 1.5 s)
_NO_LABELS: Mapping[str, str] = {}
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class _Process:
    """This process's reporter (one, made on first use and again in a forked child)."""

    lock = threading.Lock()
    reporter: _Reporter | None = None
    valid_names: set[str] = set()  # checked once (report is called every step)


class _Reporter:
    """One process's buffer, pusher thread and the agent's labels (made again after a fork)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.pid = os.getpid()
        self.labels = _agent_labels(environ)
        self.buffer = SampleBuffer(capacity=10_000)
        self.pusher: BackgroundPusher | None = None
        try:
            cfg = config.load(environ)
        except config.ConfigError as exc:  # reporting must never fail the step
            logger.warning("telemetry off: %s", exc)
            return
        address = environ.get(ADDRESS_ENV, "")
        if cfg.token and (address or cfg.mgmtd_addresses()):
            # The agent's labels go once per push (common_labels), not with every sample.
            options = PushOptions(
                token=cfg.token,
                mgmtd_addresses=cfg.mgmtd_addresses(),
                address=address,
                common_labels=self.labels,
                flush_interval_s=FLUSH_INTERVAL_S,
            )
            self.pusher = BackgroundPusher(options, self.buffer).start()

    def add(self, metrics: list[tuple[str, float]], labels: Mapping[str, str] | None, at: float) -> None:
        if self.pusher is not None:
            own = sample_labels(labels, self.labels) if labels else _NO_LABELS
            self.buffer.add_many(metrics, own, sampled_at=at)

    def close(self, timeout_s: float) -> None:
        if self.pusher is not None:
            self.pusher.close(timeout_s)


def report(*, labels: Mapping[str, str] | None = None, **metrics: float) -> None:
    """Report this step's metrics (``step=``, ``loss=``, ``tokens_per_s=``, anything else numeric).

    Raises:
        TypeError: a value is not a number (anything ``float()`` takes: ints, floats, 0-d tensors).
        ValueError: a name is not a valid metric or label name.
    """
    at = time.time()
    values = [(_metric_name(key), _number(key, value)) for key, value in metrics.items()]
    for key in labels or ():
        _check_name(key)
    _current().add(values, labels, at)


def sample_labels(given: Mapping[str, str], agent: Mapping[str, str]) -> dict[str, str]:
    """A sample's own labels: the caller's without those the agent sets.

    A sample's own label would win over the push's common labels, and the agent's must win.
    """
    return {k: v for k, v in given.items() if k not in agent}


def flush(timeout_s: float = 5.0) -> None:
    """Push what is buffered and stop the pusher (done at exit; the next ``report`` starts it again)."""
    with _Process.lock:
        reporter, _Process.reporter = _Process.reporter, None
    if reporter is not None and reporter.pid == os.getpid():
        reporter.close(timeout_s)


def _current() -> _Reporter:
    reporter = _Process.reporter
    if reporter is not None and reporter.pid == os.getpid():
        return reporter
    with _Process.lock:
        if _Process.reporter is None or _Process.reporter.pid != os.getpid():
            _Process.reporter = _Reporter(os.environ)
        return _Process.reporter


def _number(key: str, value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"{key}={value!r}: telemetry values are numbers") from None


def _check_name(key: str) -> None:
    if key not in _Process.valid_names:
        if not _NAME.fullmatch(key) or key.startswith("__"):
            raise ValueError(f"{key!r} is not a valid metric or label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        _Process.valid_names.add(key)


def _metric_name(key: str) -> str:
    _check_name(key)
    return METRIC_PREFIX + key


def _agent_labels(environ: Mapping[str, str]) -> dict[str, str]:
    raw = environ.get(LABELS_ENV, "")
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        logger.warning("%s is not JSON: samples go without the task's labels", LABELS_ENV)
        return {}
    return {str(k): str(v) for k, v in parsed.items()} if isinstance(parsed, dict) else {}


atexit.register(flush, 2.0)
