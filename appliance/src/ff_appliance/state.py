"""The state folder of a local cluster: its layout, its secrets, and the persisted cluster plan."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ff_appliance.containers import ContainerPlan
from ff_appliance.hosts import NetworkPlan, host_of
from ff_config.ports import LOOPBACK

PLAN_FORMAT_VERSION = 1

# Chooses ``count`` distinct free ports, none of them in the excluded set.
PortPicker = Callable[[int, set[int]], list[int]]


class PlanError(Exception):
    """The plan cannot be created, read or changed as asked."""


@dataclass(frozen=True)
class StateDir:
    """Where everything of one local cluster lives; nothing outside ``root`` is written."""

    root: Path

    @property
    def plan_file(self) -> Path:
        """``plan.json``: the cluster plan (instances, ports, node ids, hosts' network), replaced atomically."""
        return self.root / "plan.json"

    @property
    def secrets_dir(self) -> Path:
        """The folder of the secrets, mode 0700 (``create_dirs``)."""
        return self.root / "secrets"

    @property
    def cluster_token_file(self) -> Path:
        """The service-to-service token (``ensure_cluster_token``), mode 0600."""
        return self.secrets_dir / "cluster_token"

    @property
    def admin_token_file(self) -> Path:
        """A token of the ``admin`` user (``admin.ensure_admin_token``), mode 0600."""
        return self.secrets_dir / "admin_token"

    @property
    def database_url_file(self) -> Path:
        """``up --database``'s PostgreSQL URL (absent: SQLite files under the state folder)."""
        return self.secrets_dir / "database_url"

    @property
    def logs_dir(self) -> Path:
        """Each instance's stdout and stderr, appended across restarts (``log_file``)."""
        return self.root / "logs"

    @property
    def run_dir(self) -> Path:
        """Runtime files: pid files, ready files, the lock."""
        return self.root / "run"

    @property
    def lock_file(self) -> Path:
        """Held while ``up``, ``down``, ``join`` or ``leave`` changes the cluster, so two never interleave."""
        return self.run_dir / "appliance.lock"

    def data_dir(self, service: str) -> Path:
        """The data folder of a service, shared by its instances (e.g. mgmtd's one SQLite file)."""
        return self.root / service

    def log_file(self, instance: str) -> Path:
        """An instance's log file in ``logs_dir``."""
        return self.logs_dir / f"{instance}.log"

    def pid_file(self, instance: str) -> Path:
        """The pid of a running instance (``supervisor.running_pid`` checks it is still ours)."""
        return self.run_dir / f"{instance}.pid"

    def ready_file(self, instance: str) -> Path:
        """Written by the instance once it serves and is registered (``--ready-file``); removed before each start."""
        return self.run_dir / f"{instance}.ready.json"

    def process_marker(self, instance: str) -> str:
        """A string only this instance's command line holds: tells our process from a recycled pid."""
        return str(self.ready_file(instance))

    def create_dirs(self) -> None:
        """Make the folders of the layout (secrets 0700); nothing that exists changes."""
        for path in (self.root, self.logs_dir, self.run_dir):
            path.mkdir(parents=True, exist_ok=True)
        self.secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)


@dataclass(frozen=True, kw_only=True)
class InstancePlan:
    """One process of the cluster, with the identity and ports it keeps across restarts."""

    name: str
    service: str
    node_id: int
    grpc_port: int
    metrics_port: int
    host: str = LOOPBACK
    host_name: str = ""  # ``up --hosts``: the host (network namespace) it runs on; "": this machine's own

    @property
    def grpc_address(self) -> str:
        """``host:port`` of its gRPC server."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_address(self) -> str:
        """``host:port`` of its Prometheus metrics server."""
        return f"{self.host}:{self.metrics_port}"

    @property
    def metrics_url(self) -> str:
        """The URL Prometheus scrapes."""
        return f"http://{self.metrics_address}/metrics"


@dataclass(frozen=True, kw_only=True)
class ClusterPlan:
    """Every service instance of the cluster, chosen at the first ``up`` and reused by every later one."""

    instances: tuple[InstancePlan, ...]
    created_at: float = field(default_factory=time.time)
    network: NetworkPlan | None = None  # ``up --hosts``: the hosts' network; None: everything on loopback
    containers: ContainerPlan | None = None  # ``up --containers``: each instance in a container; None: processes

    def of_service(self, service: str) -> list[InstancePlan]:
        """The instances of ``service``, in plan order (``<service>-1`` first)."""
        return [i for i in self.instances if i.service == service]

    def find(self, name: str) -> InstancePlan:
        """The instance named ``name``.

        Raises:
            PlanError: the plan has no such instance.
        """
        for instance in self.instances:
            if instance.name == name:
                return instance
        raise PlanError(f"the plan has no instance named {name!r}")

    def to_json(self) -> str:
        """The plan as plan.json holds it, with its format version (``from_json`` reads it back)."""
        doc = {
            "format_version": PLAN_FORMAT_VERSION,
            "created_at": self.created_at,
            "instances": [asdict(i) for i in self.instances],
        }
        if self.network is not None:
            doc["network"] = self.network.to_dict()
        if self.containers is not None:
            doc["containers"] = self.containers.to_dict()
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterPlan:
        """Parse a plan file.

        Raises:
            PlanError: the text is not a plan of a format this version understands.
        """
        try:
            doc: dict[str, Any] = json.loads(text)
            if doc.get("format_version") != PLAN_FORMAT_VERSION:
                raise PlanError(f"plan format {doc.get('format_version')!r} is not {PLAN_FORMAT_VERSION}")
            instances = tuple(InstancePlan(**i) for i in doc["instances"])
            network = NetworkPlan.from_dict(doc["network"]) if doc.get("network") is not None else None
            containers = ContainerPlan.from_dict(doc["containers"]) if doc.get("containers") is not None else None
            return cls(instances=instances, created_at=float(doc["created_at"]), network=network, containers=containers)
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanError(f"the plan is not valid: {exc}") from None


def extend_plan(
    existing: ClusterPlan | None,
    counts: Mapping[str, int | None],
    defaults: Mapping[str, int],
    pick_ports: PortPicker,
) -> ClusterPlan:
    """The plan with ``counts[service]`` instances of each service; existing instances are kept as they are.

    Args:
        existing: the persisted plan, None at the first ``up``.
        counts: instances asked for per service; None (or absent) keeps what the plan has.
        defaults: every service, in start order, with its number of instances in a new plan.
        pick_ports: chooses free ports for new instances.

    New instances get the next node ids and fresh ports. A count below what the plan holds is refused:
    removing an instance would leave its node registered forever.

    Raises:
        PlanError: a count is below the planned number of instances, or not positive.
    """
    instances = list(existing.instances) if existing else []
    used_ports = {p for i in instances for p in (i.grpc_port, i.metrics_port)}
    next_node_id = max((i.node_id for i in instances), default=0) + 1
    for service, default in defaults.items():
        have = [i for i in instances if i.service == service]
        asked = counts.get(service)
        want = asked if asked is not None else (len(have) or default)
        if want < 1 or want < len(have):
            raise PlanError(
                f"cannot run {want} {service} instance(s): the plan has {len(have)} "
                "(a cluster can grow, not shrink; start a new state folder for fewer)"
            )
        for index in range(len(have) + 1, want + 1):
            grpc_port, metrics_port = pick_ports(2, used_ports)
            used_ports |= {grpc_port, metrics_port}
            instances.append(
                InstancePlan(
                    name=f"{service}-{index}",
                    service=service,
                    node_id=next_node_id,
                    grpc_port=grpc_port,
                    metrics_port=metrics_port,
                )
            )
            next_node_id += 1
    if existing is not None and len(instances) == len(existing.instances):
        return existing
    if existing is None:
        return ClusterPlan(instances=tuple(instances))
    return replace(existing, instances=tuple(instances))


def place_on_hosts(plan: ClusterPlan, network: NetworkPlan) -> ClusterPlan:
    """``plan`` on ``network``'s hosts; placed instances stay where they are, and ports and node ids are kept.

    Every instance still on loopback (all of a new plan, those a later ``up`` added) moves to its host (storage and
    agent instances, see ``hosts.host_of``) or to the bridge address (the others, so the hosts reach them).
    """
    placed: list[InstancePlan] = []
    for instance in plan.instances:
        host = host_of(instance.service, instance.name, network)
        address, name = (host.address, host.name) if host else (network.bridge_address, "")
        placed.append(replace(instance, host=address, host_name=name) if instance.host == LOOPBACK else instance)
    return replace(plan, instances=tuple(placed), network=network)


def load_plan(state: StateDir) -> ClusterPlan | None:
    """The persisted plan, or None before the first ``up``."""
    try:
        text = state.plan_file.read_text()
    except FileNotFoundError:
        return None
    return ClusterPlan.from_json(text)


def save_plan(state: StateDir, plan: ClusterPlan) -> None:
    """Write the plan to ``plan.json`` atomically (a crash leaves the old plan or the new one, never half of one)."""
    _write_atomic(state.plan_file, plan.to_json(), mode=0o644)


def write_secret(path: Path, value: str) -> None:
    """Write a secret readable by its owner only (mode 0600), atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write_atomic(path, value + "\n", mode=0o600)


def read_secret(path: Path) -> str | None:
    """A secret's value, stripped; None if the file is missing or empty."""
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def ensure_cluster_token(state: StateDir) -> str:
    """The cluster token of this state folder, created (random, 0600) on first use."""
    token = read_secret(state.cluster_token_file)
    if token is None:
        token = secrets.token_urlsafe(32)
        write_secret(state.cluster_token_file, token)
    return token


def remove_files(paths: Iterable[Path]) -> None:
    """Remove each file; a missing one is not an error."""
    for path in paths:
        path.unlink(missing_ok=True)


def _write_atomic(path: Path, text: str, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)  # the umask may have narrowed it
    tmp.replace(path)
