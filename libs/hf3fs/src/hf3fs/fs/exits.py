"""What a process exiting does for the write-back queues of its file systems: commit what they hold.

At a normal exit (atexit) and, where the process left SIGTERM to its default action, at a SIGTERM.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import weakref
from typing import Any, Protocol

SIGTERM_COMMIT_S = 8.0  # what a SIGTERM waits for queued files (docker stop waits 10 s before SIGKILL)


class CommitsAtExit(Protocol):
    """A write-back queue of a file system, as the exit hooks see it."""

    def commit_before_exit(self) -> None:
        """Commit what is queued, if the queue is live in this process; failures are the flusher's to log."""
        ...


_exiting: weakref.WeakSet[CommitsAtExit] = weakref.WeakSet()  # the write-back queues in use


def commit_at_exit(queue: CommitsAtExit) -> None:
    """Have ``queue`` committed when the process exits (or gets SIGTERM, see ``catch_sigterm``)."""
    _exiting.add(queue)
    catch_sigterm()


@atexit.register
def _commit_at_exit() -> None:
    """A process exiting with files queued for write-back commits them; what fails is logged (by the flusher)."""
    for queue in list(_exiting):
        with contextlib.suppress(Exception):
            queue.commit_before_exit()


def _commit_then_die(signum: int, frame: Any) -> None:
    """SIGTERM runs no atexit: commit the queued files first, then die of the signal as its default action would.

    SIGTERM comes from ``kill``, ``docker stop``, a task stopped. The commit lasts at most ``SIGTERM_COMMIT_S``
    and runs in another thread, so a main thread stopped inside the queue cannot hold it up.
    """
    committer = threading.Thread(target=_commit_at_exit, name="hf3fs-sigterm-commit", daemon=True)
    committer.start()
    committer.join(SIGTERM_COMMIT_S)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def catch_sigterm() -> None:
    """Commit queued files on SIGTERM, where the process left SIGTERM to its default action.

    A handler of its own is left alone: it decides how to exit, and atexit or ``fs.close()`` commit. Only the
    main thread may set a handler: a write-back first used elsewhere sets none.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _commit_then_die)
