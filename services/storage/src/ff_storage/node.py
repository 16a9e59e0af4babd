"""The storage node: its targets, the CRAQ update pipeline (head and replicas), reads, recovery, repair.

Decisions come from ``core`` (IO checks, version rules, sync diff, the target's state machine); disk
work runs in threads on the chunk engine; the node does the ordering, locking and the calls to the
other replicas. It is put together from one module per path: ``node_base`` (targets, routing, locks),
``writes`` (CRAQ), ``reads``, ``recovery`` (sync and repair).
"""

from __future__ import annotations

from collections.abc import Callable

from ff_storage.node_base import NodeConfig, Target
from ff_storage.reads import ReadPath
from ff_storage.recovery import Recovery

__all__ = ["NodeConfig", "StorageNode", "Target"]


class StorageNode(Recovery, ReadPath):
    """One storage service's node: ``NodeBase`` state with the write, read and recovery paths."""


Factory = Callable[[], StorageNode]
