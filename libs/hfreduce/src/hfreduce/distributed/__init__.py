"""hfreduce inside torch.distributed: ``import hfreduce.distributed`` registers the backend ``"hfreduce"``.

``group_from_store`` forms a plain hfreduce ``Group`` through a torch store (what ``haiscale`` uses to
derive a group from a torch process group); ``ProcessGroupHFReduce`` is the backend torch creates for
``init_process_group("hfreduce")`` / ``new_group(backend="hfreduce")``.
"""

from __future__ import annotations

from hfreduce.distributed.backend import BACKEND_NAME, ProcessGroupHFReduce, register
from hfreduce.distributed.rendezvous import Layout, group_from_store, join_store, node_key, plan_layout

register()

__all__ = [
    "BACKEND_NAME",
    "Layout",
    "ProcessGroupHFReduce",
    "group_from_store",
    "join_store",
    "node_key",
    "plan_layout",
    "register",
]
