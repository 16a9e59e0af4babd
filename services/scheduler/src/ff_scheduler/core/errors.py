"""The scheduler's one exception hierarchy (ff_scheduler.errors maps each to one status code)."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base of every error the scheduler answers with."""


class InvalidRequest(SchedulerError):
    """Malformed, missing or out-of-range fields; nothing was changed."""


class NotFoundError(SchedulerError):
    """A task, run or node that does not exist, or a task of another user (ids do not leak)."""


class Forbidden(SchedulerError):
    """The caller may not do this (e.g. a user listing every user's tasks)."""


class Unavailable(SchedulerError):
    """A service the answer depends on (3FS's meta, for a checkpoint) did not answer; nothing was changed."""


class Conflict(SchedulerError):
    """The request contradicts the current state (e.g. logs of a run on a node that is gone)."""
