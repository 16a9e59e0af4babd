"""An hfreduce ``Group`` formed through a torch.distributed ``Store`` (the rendezvous torch already did).

Every rank publishes where it runs under ``<prefix>/rank<r>``; every rank reads all of them and computes the
same layout (nodes, ranks per node); rank 0 binds the control server's socket and publishes its address
under ``<prefix>/control``; then all join the hfreduce group. Nothing here imports torch: the store is only
used through ``set``, ``get``, ``wait`` and ``check``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hfreduce.api import Group
from hfreduce.config import CONTROL_FILE_ENV, ENV_PREFIX, GroupConfig, options_from_env
from hfreduce.errors import RendezvousError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0


class Store(Protocol):
    """The part of ``torch.distributed.Store`` the rendezvous uses."""

    def set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``, visible to every rank."""

    def get(self, key: str) -> bytes:
        """The value under ``key`` (the rendezvous waits for the key first)."""

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        """Return once every key exists; raise (any exception) if one does not within ``timeout``."""

    def check(self, keys: list[str]) -> bool:
        """Whether every key exists, without waiting."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the ranks of a torch group map onto hfreduce nodes.

    Attributes:
        num_nodes: hfreduce nodes.
        local_world_size: ranks per node.
        torch_ranks: ``torch_ranks[h]`` is the torch rank of hfreduce rank ``h`` (node by node); it is the
            identity when each node's torch ranks are consecutive (torchrun, hfai).
        hosts: per node, the node key its ranks published (``FF_HFREDUCE_NODE_RANK``, else ``GROUP_RANK``,
            else the hostname).
    """

    num_nodes: int
    local_world_size: int
    torch_ranks: tuple[int, ...]
    hosts: tuple[str, ...]

    def hf_rank(self, torch_rank: int) -> int:
        """The hfreduce rank of ``torch_rank`` (ValueError if it is not a rank of the group)."""
        return self.torch_ranks.index(torch_rank)

    @property
    def is_identity(self) -> bool:
        """Whether hfreduce ranks are torch ranks, so rank-ordered buffers need no reordering."""
        return self.torch_ranks == tuple(range(len(self.torch_ranks)))


def node_key(env: Mapping[str, str], hostname: str) -> str:
    """What identifies this rank's node; ranks with the same key share a node's memory.

    ``FF_HFREDUCE_NODE_RANK`` (tests simulating nodes on one host), else torchrun's ``GROUP_RANK``, else the
    hostname.
    """
    if ENV_PREFIX + "NODE_RANK" in env:
        return f"node {env[ENV_PREFIX + 'NODE_RANK']}"
    if "GROUP_RANK" in env:
        return f"group {env['GROUP_RANK']}"
    return f"host {hostname}"


def plan_layout(records: Sequence[Mapping[str, Any]]) -> Layout:
    """The layout every rank computes from all ranks' records (``records[r]`` is torch rank ``r``'s).

    Nodes are ordered by their lowest torch rank and a node's ranks by torch rank, so torch rank 0 is
    hfreduce rank 0. hfreduce needs the same number of ranks on every node: when the nodes differ (a
    subgroup that takes 2 ranks of one node and 1 of another), every rank becomes a node of its own (all
    traffic over TCP, no shared memory) and a warning is logged.
    """
    by_node: dict[str, list[int]] = {}
    for rank, rec in enumerate(records):
        by_node.setdefault(str(rec["node"]), []).append(rank)
    nodes = sorted(by_node.items(), key=lambda item: item[1][0])
    sizes = {len(ranks) for _, ranks in nodes}
    if len(sizes) != 1:
        logger.warning(
            "hfreduce: nodes hold different numbers of ranks (%s); every rank becomes a node of its own",
            {key: len(ranks) for key, ranks in nodes},
        )
        return Layout(
            num_nodes=len(records),
            local_world_size=1,
            torch_ranks=tuple(range(len(records))),
            hosts=tuple(str(rec["node"]) for rec in records),
        )
    return Layout(
        num_nodes=len(nodes),
        local_world_size=sizes.pop(),
        torch_ranks=tuple(r for _, ranks in nodes for r in ranks),
        hosts=tuple(key for key, _ in nodes),
    )


def group_from_store(
    store: Store,
    rank: int,
    world_size: int,
    *,
    prefix: str = "hfreduce",
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> Group:
    """Form an hfreduce ``Group`` of ``world_size`` ranks through a torch.distributed store.

    Call it on every rank of the torch group, with the group's store (e.g. the one
    ``init_process_group`` made, or ``dist.distributed_c10d._get_default_store()``), this rank's rank in
    that group and its size, and a ``prefix`` no earlier call used on this store. Nodes are found from what
    each rank publishes (``node_key``); the hfreduce rank of a torch rank is ``join_store(...)[1].hf_rank``
    (the same rank when each node's torch ranks are consecutive). ``timeout_s`` (else
    ``FF_HFREDUCE_TIMEOUT_S``, else 60 s) bounds the rendezvous and every later blocking step; ``options``
    are ``GroupConfig`` fields (``chunk_size_bytes=...``), over ``FF_HFREDUCE_<FIELD>`` from ``env``.

    Raises:
        RendezvousError: a rank did not publish within the timeout (names the missing ranks), or the
            hfreduce group could not be formed.
        ValueError: ``rank``/``world_size`` out of range, or a malformed option.
    """
    return join_store(store, rank, world_size, prefix=prefix, timeout_s=timeout_s, env=env, **options)[0]


def join_store(
    store: Store,
    rank: int,
    world_size: int,
    *,
    prefix: str = "hfreduce",
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> tuple[Group, Layout]:
    """``group_from_store``, also returning the ``Layout`` (torch rank <-> hfreduce rank)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in [0, {world_size})")
    env = os.environ if env is None else env
    settings = {**options_from_env(env), **options}
    timeout = float(timeout_s if timeout_s is not None else settings.pop("timeout_s", DEFAULT_TIMEOUT_S))
    settings.pop("timeout_s", None)
    hostname = socket.gethostname()
    record = {"node": node_key(env, hostname), "host": hostname, "zone": str(settings.get("zone", ""))}
    store.set(f"{prefix}/rank{rank}", json.dumps(record))
    keys = [f"{prefix}/rank{r}" for r in range(world_size)]
    _wait(store, keys, timeout, what="publish its node")
    records = [json.loads(store.get(k)) for k in keys]
    layout = plan_layout(records)
    hf_rank = layout.hf_rank(rank)
    listener = None
    if hf_rank == 0:
        listener = socket.create_server(("", 0), backlog=128)
        addr = _control_addr(env, one_host=len({str(rec["host"]) for rec in records}) == 1)
        store.set(f"{prefix}/control", json.dumps({"addr": addr, "port": listener.getsockname()[1]}))
    try:
        _wait(store, [f"{prefix}/control"], timeout, what="publish the control address", ranks=[layout.torch_ranks[0]])
        control = json.loads(store.get(f"{prefix}/control"))
        _publish_control(env, control)
        settings.pop("zone", None)
        config = GroupConfig(
            master_addr=str(control["addr"]),
            master_port=int(control["port"]),
            node_rank=hf_rank // layout.local_world_size,
            num_nodes=layout.num_nodes,
            local_rank=hf_rank % layout.local_world_size,
            local_world_size=layout.local_world_size,
            zone=record["zone"],
            timeout_s=timeout,
            **settings,
        )
        group = Group(config, control_listener=listener)
    except BaseException:
        if listener is not None:
            listener.close()
        raise
    return group, layout


def _publish_control(env: Mapping[str, str], control: dict[str, Any]) -> None:
    """Write the control server's address where ``FF_HFREDUCE_CONTROL_FILE`` says (if set).

    The node agent's hang detection asks that server for the ranks' progress. A failure to write is logged, not
    raised.
    """
    path = env.get(CONTROL_FILE_ENV, "")
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"addr": str(control["addr"]), "port": int(control["port"])}, f)
        os.replace(tmp, path)
    except OSError as err:
        logger.warning("cannot write the control address to %s: %s", path, err)


def _wait(store: Store, keys: list[str], timeout_s: float, *, what: str, ranks: Sequence[int] = ()) -> None:
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # torch raises DistStoreError (a RuntimeError) or its own timeout type
        missing = [r for r, k in zip(ranks or range(len(keys)), keys, strict=True) if not _has(store, k)]
        raise RendezvousError(
            f"ranks {missing} did not {what} in the store within {timeout_s:g} s: {exc}", missing_ranks=tuple(missing)
        ) from exc


def _has(store: Store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False


def _control_addr(env: Mapping[str, str], *, one_host: bool) -> str:
    """The address other ranks reach rank 0's control server on.

    ``FF_HFREDUCE_MASTER_ADDR``; loopback when every rank runs on this host; else the local address of the route
    to ``MASTER_ADDR`` (the torch store's host); else this host's name resolved.
    """
    if ENV_PREFIX + "MASTER_ADDR" in env:
        return env[ENV_PREFIX + "MASTER_ADDR"]
    if one_host:
        return "127.0.0.1"
    target = env.get("MASTER_ADDR")
    if target:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((target, 9))  # no packet is sent: this only asks the kernel for a route
                local: str = probe.getsockname()[0]
            if not local.startswith("127.") or target.startswith("127."):
                return local
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())
