"""Group configuration: one frozen settings object, built from arguments or from the environment."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Literal

Algorithm = Literal["tree", "ring"]
WireDType = Literal["bf16", "fp16"]
PipelineMode = Literal["auto", "threads", "loop"]

ENV_PREFIX = "FF_HFREDUCE_"
# Where a group formed through a store (its control server on a free port, not MASTER_PORT) writes that
# server's address, {"addr": ..., "port": ...}: a node agent reads it to watch the ranks' collective progress.
CONTROL_FILE_ENV = ENV_PREFIX + "CONTROL_FILE"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """How one rank joins an hfreduce group.

    A group has ``num_nodes`` nodes with ``local_world_size`` ranks each; global rank is
    ``node_rank * local_world_size + local_rank``. Global rank 0 hosts the rendezvous and control server
    on ``master_addr:master_port``.

    Attributes:
        master_addr: address of global rank 0.
        master_port: port of the rendezvous/control server on global rank 0.
        node_rank: this rank's node, ``0 <= node_rank < num_nodes``.
        num_nodes: number of nodes.
        local_rank: this rank's index within its node.
        local_world_size: ranks per node (the same on every node).
        zone: network zone of this node; nodes are ordered zone by zone so trees cross zones once.
        timeout_s: limit on every blocking step (rendezvous, each chunk send/receive, each barrier).
        chunk_size_bytes: pipeline chunk size (4 MiB: each chunk costs thread hand-offs or task switches,
            and system calls; on the 2-core dev box 1 MiB took 15-20 % more CPU with threads, and on the
            event loop 1, 2 and 4 MiB measured alike, 8 MiB slower); smaller
            slices use smaller chunks, down to 1 MiB, so each tree half still has 4 chunks to pipeline.
        shm_slot_bytes: cap on the per-rank shared-memory staging slot (it grows to the largest tensor
            seen, up to this); larger tensors go through in segments of this size.
        algorithm: ``"tree"`` (HFReduce: intra-node reduce + double binary tree) or ``"ring"`` (flat ring
            over all ranks, for comparison).
        compression: send fp32 data as bf16 or fp16 on the wire (tree algorithm only), or None.
        socket_buffer_bytes: explicit SO_SNDBUF/SO_RCVBUF, or 0 to keep kernel autotuning.
        cross_memory: let local ranks read and write each other's ordinary buffers directly
            (``process_vm_readv``/``writev``; used only when every local rank may): no copy into shared
            memory and no copy back. False: always stage ordinary buffers through shared memory.
        pipeline: how the pipeline's tasks run: ``"threads"`` (a thread per tree and direction, as HFReduce),
            ``"loop"`` (all on one event-loop thread), or ``"auto"``: threads when this process may use at
            least 2 cores per local rank, else the loop (``runners.choose``).
    """

    master_addr: str
    master_port: int
    node_rank: int
    num_nodes: int
    local_rank: int = 0
    local_world_size: int = 1
    zone: str = ""
    timeout_s: float = 60.0
    chunk_size_bytes: int = 4 << 20
    shm_slot_bytes: int = 256 << 20
    algorithm: Algorithm = "tree"
    compression: WireDType | None = None
    socket_buffer_bytes: int = 0
    cross_memory: bool = True
    pipeline: PipelineMode = "auto"

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.local_world_size < 1:
            raise ValueError(
                f"need num_nodes >= 1 and local_world_size >= 1, got {self.num_nodes}, {self.local_world_size}"
            )
        if not 0 <= self.node_rank < self.num_nodes:
            raise ValueError(f"node_rank {self.node_rank} not in [0, {self.num_nodes})")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local_rank {self.local_rank} not in [0, {self.local_world_size})")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port {self.master_port} out of range")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.chunk_size_bytes < 64 or self.chunk_size_bytes % 8:
            raise ValueError(f"chunk_size_bytes must be a multiple of 8 and >= 64, got {self.chunk_size_bytes}")
        if self.shm_slot_bytes < self.chunk_size_bytes:
            raise ValueError("shm_slot_bytes must be at least chunk_size_bytes")
        if self.algorithm not in ("tree", "ring"):
            raise ValueError(f"unknown algorithm {self.algorithm!r}")
        if self.compression not in (None, "bf16", "fp16"):
            raise ValueError(f"unknown compression {self.compression!r}")
        if self.pipeline not in ("auto", "threads", "loop"):
            raise ValueError(f"unknown pipeline {self.pipeline!r} (auto, threads or loop)")

    @property
    def world_size(self) -> int:
        """Number of ranks over all nodes (``num_nodes * local_world_size``)."""
        return self.num_nodes * self.local_world_size

    @property
    def rank(self) -> int:
        """Global rank: local ranks are numbered node by node."""
        return self.node_rank * self.local_world_size + self.local_rank

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> GroupConfig:
        """Build a config from environment variables (HAI launcher convention).

        Layout comes from ``MASTER_ADDR`` (or ``MASTER_IP``), ``MASTER_PORT``, ``FF_HFREDUCE_NUM_NODES``
        (else ``WORLD_SIZE``, which HAI sets to the number of nodes), ``FF_HFREDUCE_NODE_RANK`` (else
        ``RANK``, the node rank under HAI), ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``. Options come from
        ``FF_HFREDUCE_<FIELD>`` (e.g. ``FF_HFREDUCE_TIMEOUT_S``). Keyword overrides win over the environment.

        Raises:
            ValueError: a required variable is missing or a value is malformed.
        """
        env = os.environ if env is None else env

        def first(*names: str) -> str:
            for name in names:
                if name in env:
                    return env[name]
            raise ValueError(f"environment variable {' or '.join(names)} is required")

        values: dict[str, object] = {
            "master_addr": first("MASTER_ADDR", "MASTER_IP"),
            "master_port": int(first("MASTER_PORT")),
            "num_nodes": int(first(ENV_PREFIX + "NUM_NODES", "WORLD_SIZE")),
            "node_rank": int(first(ENV_PREFIX + "NODE_RANK", "RANK")),
            "local_rank": int(env.get("LOCAL_RANK", "0")),
            "local_world_size": int(env.get("LOCAL_WORLD_SIZE", "1")),
        }
        values.update(options_from_env(env))
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def options_from_env(env: Mapping[str, str] | None = None) -> dict[str, object]:
    """The ``FF_HFREDUCE_<FIELD>`` settings present in ``env`` (default ``os.environ``), parsed, by field name.

    ``FF_HFREDUCE_NUM_NODES`` and ``FF_HFREDUCE_NODE_RANK`` describe the layout, not options: left out.

    Raises:
        ValueError: a value is malformed.
    """
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for field in dataclasses.fields(GroupConfig):
        raw = env.get(ENV_PREFIX + field.name.upper())
        if raw is None or field.name in ("num_nodes", "node_rank"):
            continue
        values[field.name] = _parse(field.name, raw)
    return values


def _parse(name: str, raw: str) -> object:
    if name in ("timeout_s",):
        return float(raw)
    if name in ("zone", "algorithm", "master_addr", "pipeline"):
        return raw
    if name == "compression":
        return raw or None
    if name == "cross_memory":
        if raw.lower() not in ("0", "1", "true", "false", "yes", "no"):
            raise ValueError(f"{ENV_PREFIX}CROSS_MEMORY must be 0/1/true/false/yes/no, got {raw!r}")
        return raw.lower() in ("1", "true", "yes")
    return int(raw)
