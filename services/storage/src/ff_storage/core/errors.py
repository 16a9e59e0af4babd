"""The storage service's one exception hierarchy (ff_storage.errors maps each to one status code)."""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error the storage service answers a whole call with."""


class InvalidRequest(StorageError):
    """Malformed IO: ids, offsets or lengths out of range, oversized, unknown chain; nothing was written."""


class NotServing(StorageError):
    """The target does not serve this call now (not the head, not serving, a step of it not done).

    The caller retries after fresh routing. Only for calls without per-IO results (those carry a status per IO
    instead).
    """


class TooCostly(StorageError):
    """A request over the node's cost limits (IOs or bytes per call); refused before any work."""


class TargetNotFound(StorageError):
    """No such target on this node."""


class TargetExists(StorageError):
    """A target id already used with other arguments."""


class Forbidden(StorageError):
    """The caller may not touch this transfer or chunk."""


class ChunkCorrupt(StorageError):
    """The stored chunk does not match its checksum."""


class PendingReplaced(StorageError):
    """A newer update of the chunk took its place while this one was in flight (its caller had given up)."""
