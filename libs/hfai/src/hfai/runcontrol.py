"""The run-control folder: how a task's processes and the agent of their node talk (no network).

HAI used a 1-byte SysV shared-memory flag for the suspend command and Redis for the rest; here one
folder per run on the node (``$HFAI_RUN_DIR``) holds:

- ``suspend``: written by the agent (``b"1"``) to ask rank 0 to suspend (``receive_suspend_command``);
- ``events.jsonl``: appended by the SDK, one JSON object per line with a ``seq`` and a ``kind``:
  ``received`` (rank 0 read the flag), ``go_suspend`` (checkpoint saved: stop me now), ``whole_life_state``
  (``value``), ``watchdog_time`` (``seconds``), ``checkpoint`` (``path``, ``step``,
  ``taken_at``: when its state was captured, 0 if not told);
- ``acked``: the highest ``seq`` the agent has relayed to the scheduler (stored durably there), so
  ``set_whole_life_state`` returns only once the value will reach the next run.

The agent side (``RunControl.raise_suspend``, ``new_events``, ``ack``) is used by the node agent and by
``hfai``'s local mode, which plays the agent on this machine.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RUN_DIR_ENV = "HFAI_RUN_DIR"
SUSPEND_FILE = "suspend"
EVENTS_FILE = "events.jsonl"
ACKED_FILE = "acked"

RECEIVED = "received"
GO_SUSPEND = "go_suspend"
WHOLE_LIFE_STATE = "whole_life_state"
WATCHDOG_TIME = "watchdog_time"
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Event:
    """One line of ``events.jsonl``: its sequence number, its kind (``received``, ...) and the rest of its fields."""

    seq: int
    kind: str
    data: dict[str, Any]

    @property
    def written_at(self) -> float:
        """When the task appended it (``seq`` is its ``time.time_ns()``), on this node's clock."""
        return self.seq / 1e9


class RunControl:
    """One run's control folder (both sides)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._read_offset = 0
        self._skipping = False  # inside a line too long to be an event

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RunControl | None:
        """The folder ``$HFAI_RUN_DIR`` names; None outside a task (the variable unset or empty)."""
        value = (environ if environ is not None else os.environ).get(RUN_DIR_ENV)
        return cls(Path(value)) if value else None

    def create(self) -> RunControl:
        """Makes the folder (the agent, before it starts the ranks); returns ``self``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        return self

    # ---- agent side ----

    def raise_suspend(self) -> None:
        """Asks the task to suspend: rank 0 sees it in ``suspend_requested`` (``receive_suspend_command``)."""
        _atomic_write(self.folder / SUSPEND_FILE, b"1")

    def clear_suspend(self) -> None:
        """Withdraws the suspend request (the flag reads ``0`` again)."""
        _atomic_write(self.folder / SUSPEND_FILE, b"0")

    def new_events(self) -> list[Event]:
        """Events appended since the last call (complete lines only), each checked as the SDK writes it.

        The ranks may write anything to the file: a line that is not an event of the SDK (not JSON, a field of the
        wrong type or out of the range the scheduler stores) is dropped and counted in a warning, so it cannot
        stop the events after it; a line longer than ``MAX_EVENT_BYTES`` is skipped unread. At most
        ``READ_BYTES_PER_CALL`` are read per call: a file of gigabytes is read over many ticks, never held whole.
        """
        path = self.folder / EVENTS_FILE
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return []
        events: list[Event] = []
        dropped = 0
        with f:
            for _ in range(READ_BYTES_PER_CALL // READ_CHUNK_BYTES):
                f.seek(self._read_offset)
                chunk = f.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                if self._skipping:  # the rest of a line too long to be an event
                    end = chunk.find(b"\n")
                    self._read_offset += len(chunk) if end < 0 else end + 1
                    self._skipping = end < 0
                    continue
                end = chunk.rfind(b"\n")
                if end < 0:
                    if len(chunk) <= MAX_EVENT_BYTES:
                        break  # the end of the line is not written yet
                    self._read_offset += len(chunk)
                    self._skipping, dropped = True, dropped + 1
                    continue
                self._read_offset += end + 1
                for line in chunk[: end + 1].splitlines():
                    event = parse_event(line)
                    if event is None:
                        dropped += 1
                    else:
                        events.append(event)
        if dropped:
            logger.warning("%s: dropped %d lines that are no events of the SDK", path, dropped)
        return events

    def ack(self, seq: int) -> None:
        """Records that every event up to ``seq`` reached the scheduler; ``wait_acked`` in the task then returns."""
        _atomic_write(self.folder / ACKED_FILE, str(seq).encode())

    # ---- task side ----

    def suspend_requested(self) -> bool:
        """Whether the agent has raised the suspend flag (and not cleared it)."""
        try:
            return (self.folder / SUSPEND_FILE).read_bytes()[:1] == b"1"
        except FileNotFoundError:
            return False

    def append(self, kind: str, **data: Any) -> int:
        """Append an event; its sequence number (unique per run, increasing)."""
        path = self.folder / EVENTS_FILE
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            seq = time.time_ns()
            os.write(fd, (json.dumps({"seq": seq, "kind": kind, **data}) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return seq

    def acked(self) -> int:
        """The highest ``seq`` the agent has acknowledged; 0 before the first."""
        try:
            return int((self.folder / ACKED_FILE).read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def wait_acked(self, seq: int, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Blocks until the agent acknowledged ``seq`` (True) or ``timeout_s`` passed (False), polling."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.acked() >= seq:
                return True
            time.sleep(poll_s)
        return self.acked() >= seq


INT64 = 2**63
MAX_PATH_CHARS = 4096  # what the scheduler stores of a checkpoint's path
MAX_EVENT_BYTES = 64 << 10  # far more than any event the SDK writes
READ_CHUNK_BYTES = 1 << 20
READ_BYTES_PER_CALL = 16 << 20


def is_int64(value: Any) -> bool:
    """Whether ``value`` is an integer the scheduler can store (int64; not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and -INT64 <= value < INT64


def is_seconds(value: Any, *, positive: bool = False) -> bool:
    """Whether ``value`` is a finite number of seconds >= 0 (> 0 with ``positive``)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (value > 0 if positive else value >= 0)


def is_checkpoint_path(value: Any) -> bool:
    """Whether ``value`` can be a reported checkpoint's path: a string of 1 to ``MAX_PATH_CHARS`` characters."""
    return isinstance(value, str) and 0 < len(value) <= MAX_PATH_CHARS


_FIELDS_OK: dict[str, Callable[[dict[str, Any]], bool]] = {
    CHECKPOINT: lambda d: (
        is_checkpoint_path(d.get("path")) and is_int64(d.get("step")) and is_seconds(d.get("taken_at", 0.0))
    ),
    WHOLE_LIFE_STATE: lambda d: is_int64(d.get("value")),
    WATCHDOG_TIME: lambda d: is_seconds(d.get("seconds"), positive=True),
}


def parse_event(line: bytes) -> Event | None:
    """The event of one line of ``events.jsonl``; None for a line the SDK would not write.

    Each known kind's fields are checked as the SDK checks them (other kinds pass: an agent ignores them).
    """
    if len(line) > MAX_EVENT_BYTES:
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    seq, kind = obj.pop("seq", None), obj.pop("kind", None)
    if not is_int64(seq) or seq <= 0 or not isinstance(kind, str):
        return None
    fields_ok = _FIELDS_OK.get(kind)
    if fields_ok is not None and not fields_ok(obj):
        return None
    return Event(seq, kind, obj)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
