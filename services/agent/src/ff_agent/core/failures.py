"""Which failure of a run's ranks on this node is the root cause, and whose fault it is.

torch.distributed.elastic's rule: when several ranks fail, the first one by time is the cause (the
others usually die because of it). A rank's time is the timestamp of its error file (written by the
rank hook's excepthook when the exception happened) or, without one, when the agent saw it exit.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

# Exceptions that say the machine or the network failed the task, not its code.
INFRASTRUCTURE_ERRORS = frozenset(
    {
        "PeerFailureError",
        "RendezvousError",
        "HFReduceError",
        "GroupClosedError",
        "ConnectionResetError",
        "ConnectionRefusedError",
        "BrokenPipeError",
        "MemoryError",
    }
)
# Deaths by signal that come from the machine (OOM killer, bus error, power), not from the code.
INFRASTRUCTURE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGBUS})
# A shell's "command not found" / "not executable": the launch failed.
LAUNCH_EXIT_CODES = frozenset({126, 127})


class FailureClass(enum.IntEnum):
    """Whose fault a failure is: the task's code, the platform's launch, or the machine or network."""

    USER = 1
    PLATFORM = 2
    INFRASTRUCTURE = 3


@dataclass(frozen=True, kw_only=True)
class ErrorRecord:
    """What a rank's error file says."""

    timestamp: float
    exc_type: str
    message: str


@dataclass(frozen=True, kw_only=True)
class RankExit:
    """How one local rank's process ended, with its error file and the end of its log when there are any."""

    local_rank: int
    exit_code: int
    signal: int
    exited_at: float
    # The agent had started stopping the run when it ended: not a failure.
    stopped_by_agent: bool = False
    error: ErrorRecord | None = None
    log_tail: str = ""

    @property
    def failed(self) -> bool:
        """Whether the rank ended badly (non-zero exit or a signal) without the agent having stopped it."""
        return not self.stopped_by_agent and (self.exit_code != 0 or self.signal != 0)

    @property
    def failed_at(self) -> float:
        """When the rank failed (epoch seconds): its error file's time, else when the agent saw it exit."""
        return self.error.timestamp if self.error is not None else self.exited_at


@dataclass(frozen=True, kw_only=True)
class Failure:
    """A run's root-cause failure on this node, as reported to the scheduler."""

    failure_class: FailureClass
    local_rank: int
    exit_code: int
    signal: int
    failed_at: float
    message: str
    hang: bool = False  # found hung by hang detection, not exited


def _classify(rank: RankExit) -> FailureClass:
    if rank.error is not None:
        return FailureClass.INFRASTRUCTURE if rank.error.exc_type in INFRASTRUCTURE_ERRORS else FailureClass.USER
    if rank.signal in INFRASTRUCTURE_SIGNALS:
        return FailureClass.INFRASTRUCTURE
    if rank.exit_code in LAUNCH_EXIT_CODES:
        return FailureClass.PLATFORM
    return FailureClass.USER


def _describe(rank: RankExit) -> str:
    how = f"killed by {_signal_name(rank.signal)}" if rank.signal else f"exited with {rank.exit_code}"
    if rank.error is not None:
        return f"local rank {rank.local_rank} {how}: {rank.error.exc_type}: {rank.error.message}"[:2000]
    tail = rank.log_tail.strip().splitlines()[-3:]
    return (f"local rank {rank.local_rank} {how}" + (": " + " | ".join(tail) if tail else ""))[:2000]


def root_cause(ranks: list[RankExit]) -> Failure | None:
    """The first failure by time among the ranks that ended, or None when none failed."""
    failed = [r for r in ranks if r.failed]
    if not failed:
        return None
    first = min(failed, key=lambda r: (r.failed_at, r.local_rank))
    return Failure(
        failure_class=_classify(first),
        local_rank=first.local_rank,
        exit_code=first.exit_code,
        signal=first.signal,
        failed_at=first.failed_at,
        message=_describe(first),
    )


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
