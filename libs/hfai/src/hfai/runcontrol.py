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
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        """Events appended since the last call (complete lines only)."""
        path = self.folder / EVENTS_FILE
        try:
            with path.open("rb") as f:
                f.seek(self._read_offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._read_offset += len(complete)
        events = []
        for line in complete.splitlines():
            obj = json.loads(line)
            events.append(Event(int(obj.pop("seq")), str(obj.pop("kind")), obj))
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


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
