"""The suspend protocol's deadlines as the agent enforces them (they hold even if the scheduler is gone).

On the node of rank 0 the flag is raised: no acknowledgement within ``ack_window_s`` -> stop; once
acknowledged, stop when ``grace_s`` has passed or when the task calls go_suspend(). The other nodes
cannot see the flag's acknowledgement, so they stop at the latest possible end (window + grace), or
earlier when the task calls go_suspend() there, or when the scheduler orders the stop.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class SuspendClock:
    """One run's suspend deadlines on this node (times in ``time.time()`` seconds); ``stop_due`` applies them."""

    requested_at: float
    ack_window_s: float
    grace_s: float
    term_grace_s: float
    flag_node: bool
    received_at: float | None = None
    go_suspend_at: float | None = None

    def received(self, now: float) -> None:
        """Note that the task acknowledged the suspend flag (the first acknowledgement counts)."""
        if self.received_at is None:
            self.received_at = now

    def go_suspend(self, now: float) -> None:
        """Note that the task said, through the SDK, that its checkpoint is done: it may be stopped now."""
        if self.go_suspend_at is None:
            self.go_suspend_at = now

    def stop_due(self, now: float) -> str | None:
        """Why the run must be stopped now, or None while it may go on checkpointing."""
        if self.go_suspend_at is not None:
            return "the task called go_suspend()"
        if self.flag_node:
            if self.received_at is None:
                if now >= self.requested_at + self.ack_window_s:
                    return f"suspend not acknowledged within {self.ack_window_s:g} s"
                return None
            if now >= self.received_at + self.grace_s:
                return f"grace of {self.grace_s:g} s is over"
            return None
        if now >= self.requested_at + self.ack_window_s + self.grace_s:
            return f"acknowledge window and grace ({self.ack_window_s + self.grace_s:g} s) are over"
        return None
