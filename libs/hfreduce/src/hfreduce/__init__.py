"""hfreduce: two-level allreduce (intra-node reduce in shared memory, inter-node double binary tree)."""

from __future__ import annotations

from hfreduce.agreement import CollectiveMismatchError
from hfreduce.api import Group, Work
from hfreduce.config import GroupConfig
from hfreduce.control import query_status
from hfreduce.counters import Counters, expected_allreduce_counters, paper_memory_ops_per_byte
from hfreduce.errors import GroupClosedError, HFReduceError, PeerFailureError, RendezvousError
from hfreduce.reduction import DType, ReduceOp
from hfreduce.trees import build_trees, double_binary_tree

__all__ = [
    "CollectiveMismatchError",
    "Counters",
    "DType",
    "Group",
    "GroupClosedError",
    "GroupConfig",
    "HFReduceError",
    "PeerFailureError",
    "ReduceOp",
    "RendezvousError",
    "Work",
    "build_trees",
    "double_binary_tree",
    "expected_allreduce_counters",
    "paper_memory_ops_per_byte",
    "query_status",
]
