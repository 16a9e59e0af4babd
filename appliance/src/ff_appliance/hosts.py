"""``up --hosts N``: the storage and agent instances on N "hosts", each a network namespace of this machine.

Each host has its own address on a veth joined to a bridge, so the data path and the agents' collectives cross real
links.

Layout of one cluster's network (every name starts with the cluster's prefix ``ff-<6 hex>``, so ``down``, or a
crashed test's cleanup, removes exactly what this cluster made):

- a bridge ``<prefix>-br`` in this (the root) namespace holding ``<subnet>.1/24``: the control-plane services
  (mgmtd, meta, the scheduler, telemetry) listen on it, reachable from this machine and from every host;
- per host ``hN``: a namespace ``<prefix>-hN`` whose link ``<prefix>-hNp`` holds ``<subnet>.(10+N)/24``, the
  other end ``<prefix>-hNv`` of its veth pair on the bridge; instances placed there run under
  ``ip netns exec``;
- optionally a shape per host link (``tc``): a rate (``tbf``) and a delay (``netem``, when the kernel has it),
  on both ends, so both directions are shaped.

The layout is pure (``new_network``, ``place_instances``: unit-tested); ``ensure_network`` and
``remove_network`` do the I/O with ``ip`` and ``tc`` and need root.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HOSTED_SERVICES = ("storage", "agent")  # the services placed on hosts; the others listen on the bridge
MAX_HOSTS = 50
HOST_ADDRESS_OFFSET = 10  # host hN is <subnet>.(10 + N)
JOIN_ADDRESS_OFFSET = 100  # spare addresses for machines played by namespaces (``add_host``), above the hosts
SUBNET_PREFIX_LEN = 24
_HOST_NAME = re.compile(r"^[a-z][0-9]{1,3}$")  # short: interface names are at most 15 characters
_RATE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$")
_DELAY = re.compile(r"^([0-9]+(\.[0-9]+)?)ms$")
_ZONE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_PREFIX = re.compile(r"^ff-[0-9a-f]{6}$")  # ff-<3 random bytes>: names made by new_network and nothing else
_NETNS_DIR = Path("/run/netns")
_SYS_NET = Path("/sys/class/net")
IP_TIMEOUT_S = 10.0


class HostsError(Exception):
    """The hosts network cannot be laid out, made or removed as asked."""


@dataclass(frozen=True, kw_only=True)
class LinkShape:
    """What ``tc`` puts on a host's link (both directions): a rate such as ``100mbit``, a delay in ms."""

    rate: str = ""
    delay_ms: float = 0.0

    def describe(self) -> str:
        """The shape as ``--link-shape`` writes it (``rate=100mbit,delay=2ms``); "" for no shape."""
        parts = ([f"rate={self.rate}"] if self.rate else []) + ([f"delay={self.delay_ms:g}ms"] if self.delay_ms else [])
        return ",".join(parts)


def parse_link_shape(text: str) -> tuple[str | None, LinkShape | None]:
    """Parse ``--link-shape [HOST:]rate=100mbit,delay=2ms``: the host (None: every host) and the shape.

    ``[HOST:]none`` gives the shape None: the link unshaped again.

    Raises:
        HostsError: the text is not that.
    """
    host, sep, spec = text.strip().partition(":")
    if not sep:
        host, spec = "", host
    if host and not _HOST_NAME.match(host):
        raise HostsError(f"--link-shape {text!r}: {host!r} is not a host name such as h3")
    if spec.strip() == "none":
        return host or None, None
    rate, delay_ms = "", 0.0
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        key, _, value = item.partition("=")
        if key == "rate" and _RATE.match(value):
            rate = value
        elif key == "delay" and (found := _DELAY.match(value)):
            delay_ms = float(found.group(1))
        else:
            raise HostsError(f"--link-shape {text!r}: {item!r} is not rate=<N>(bit|kbit|mbit|gbit) or delay=<N>ms")
    if not rate and not delay_ms:
        raise HostsError(f"--link-shape {text!r}: give rate=..., delay=... or both")
    return host or None, LinkShape(rate=rate, delay_ms=delay_ms)


@dataclass(frozen=True, kw_only=True)
class HostPlan:
    """One host: its short name (``h1``), its address, the shape of its link, and the network zone of its agents.

    A shape of None: as fast as veth goes. Zone "": the scheduler's default; another zone models a host across a slower
    link.
    """

    name: str
    address: str
    shape: LinkShape | None = None
    zone: str = ""


@dataclass(frozen=True, kw_only=True)
class NetworkPlan:
    """The network of one cluster's hosts, kept in the plan so every ``up`` makes the same one."""

    prefix: str  # ff-<6 hex>
    subnet: str  # the first three octets, e.g. "10.77.12"
    hosts: tuple[HostPlan, ...]

    @property
    def bridge(self) -> str:
        """The bridge's link name in the root namespace."""
        return f"{self.prefix}-br"

    @property
    def bridge_address(self) -> str:
        """The bridge's address, where the control-plane services listen."""
        return f"{self.subnet}.1"

    def host(self, name: str) -> HostPlan:
        """The host named ``name``.

        Raises:
            HostsError: the plan has no such host.
        """
        for host in self.hosts:
            if host.name == name:
                return host
        raise HostsError(f"the plan has no host named {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    def netns(self, host: str) -> str:
        """The network namespace of ``host``."""
        return f"{self.prefix}-{host}"

    def bridge_link(self, host: str) -> str:
        """The root-namespace end of the host's veth pair, on the bridge."""
        return f"{self.prefix}-{host}v"

    def host_link(self, host: str) -> str:
        """The end inside the host's namespace, holding its address."""
        return f"{self.prefix}-{host}p"

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data for plan.json (``from_dict`` reads it back)."""
        return {
            "prefix": self.prefix,
            "subnet": self.subnet,
            "hosts": [
                {
                    "name": h.name,
                    "address": h.address,
                    "shape": None if h.shape is None else {"rate": h.shape.rate, "delay_ms": h.shape.delay_ms},
                    "zone": h.zone,
                }
                for h in self.hosts
            ],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> NetworkPlan:
        """Raises: KeyError, TypeError, ValueError: not a network plan."""
        hosts = tuple(
            HostPlan(
                name=str(h["name"]),
                address=str(h["address"]),
                shape=None if h.get("shape") is None else LinkShape(**h["shape"]),
                zone=str(h.get("zone", "")),
            )
            for h in doc["hosts"]
        )
        prefix = str(doc["prefix"])
        bad_names = [h.name for h in hosts if not _HOST_NAME.match(h.name)]
        if not _PREFIX.match(prefix) or bad_names:  # these names go to `ip ... del`, as root
            raise ValueError(f"not a network made by fireflyer: prefix {prefix!r}, host names {bad_names}")
        return cls(prefix=prefix, subnet=str(doc["subnet"]), hosts=hosts)


def new_network(num_hosts: int, taken: Iterable[ipaddress.IPv4Network], short_id: str | None = None) -> NetworkPlan:
    """A new network of ``num_hosts`` hosts on a 10.x.y.0/24 that overlaps none of ``taken``.

    ``taken``: this machine's addresses and routes (``taken_networks``).

    Raises:
        HostsError: ``num_hosts`` is not in 1..MAX_HOSTS, or no free /24 was found.
    """
    if not 1 <= num_hosts <= MAX_HOSTS:
        raise HostsError(f"--hosts {num_hosts}: give 1 to {MAX_HOSTS} hosts")
    short_id = short_id or secrets.token_hex(3)
    taken = list(taken)
    seed = int(short_id, 16)
    for attempt in range(4096):  # start from the id, so two clusters made at once rarely pick the same one
        n = (seed + attempt * 7919) % (190 * 256)
        candidate = ipaddress.IPv4Network(f"10.{64 + n // 256}.{n % 256}.0/{SUBNET_PREFIX_LEN}")
        if not any(candidate.overlaps(t) for t in taken):
            subnet = str(candidate.network_address).rsplit(".", 1)[0]
            hosts = tuple(
                HostPlan(name=f"h{i}", address=f"{subnet}.{HOST_ADDRESS_OFFSET + i}") for i in range(1, num_hosts + 1)
            )
            return NetworkPlan(prefix=f"ff-{short_id}", subnet=subnet, hosts=hosts)
    raise HostsError("no free 10.x.y.0/24 for the hosts network: this machine's addresses cover them all")


def with_shapes(network: NetworkPlan, shapes: Sequence[tuple[str | None, LinkShape | None]]) -> NetworkPlan:
    """The network with ``--link-shape`` applied: one for every host (None), then those for named hosts.

    Raises:
        HostsError: a named host is not in the network.
    """
    hosts = {h.name: h for h in network.hosts}
    for name, shape in sorted(shapes, key=lambda s: s[0] is not None):
        for target in hosts.values() if name is None else [network.host(name)]:
            hosts[target.name] = replace(hosts[target.name], shape=shape)
    return replace(network, hosts=tuple(hosts.values()))


def parse_host_zone(text: str) -> tuple[str, str]:
    """``--host-zone h3=far``: the host and the zone of its agents (``h3=``: the default zone again).

    Raises:
        HostsError: the text is not that.
    """
    host, sep, zone = text.strip().partition("=")
    if not sep or not _HOST_NAME.match(host) or (zone and not _ZONE.match(zone)):
        raise HostsError(f"--host-zone {text!r}: expected HOST=ZONE, e.g. h3=far (a zone: letters, digits, . _ -)")
    return host, zone


def with_zones(network: NetworkPlan, zones: Sequence[tuple[str, str]]) -> NetworkPlan:
    """The network with ``--host-zone`` applied.

    Raises:
        HostsError: a named host is not in the network.
    """
    hosts = {h.name: h for h in network.hosts}
    for name, zone in zones:
        host = network.host(name)
        hosts[host.name] = replace(hosts[host.name], zone=zone)
    return replace(network, hosts=tuple(hosts.values()))


def instance_index(name: str) -> int:
    """``storage-4`` -> 4."""
    return int(name.rsplit("-", 1)[1])


def host_of(service: str, name: str, network: NetworkPlan) -> HostPlan | None:
    """Where an instance runs: storage and agent instances round-robin over the hosts; None: on the bridge.

    ``storage-1`` on h1, ``storage-2`` on h2..., so a chain's replicas and a task's nodes are on different hosts.
    """
    if service not in HOSTED_SERVICES:
        return None
    return network.hosts[(instance_index(name) - 1) % len(network.hosts)]


# ---- I/O: ip and tc (root only) ----


def check_can_make() -> None:
    """Raises: HostsError: network namespaces cannot be made here (not root, no ``ip``)."""
    if os.geteuid() != 0:
        raise HostsError("--hosts makes network namespaces, veth links and a bridge: it needs root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise HostsError(f"--hosts needs the {tool!r} command (iproute2)")


def check_shapes(shapes: Iterable[LinkShape | None]) -> None:
    """Check that this kernel can apply ``shapes`` before they are kept in the plan.

    A delay needs ``netem``: it is probed in a throwaway namespace.

    Raises:
        HostsError: a delay is asked for and this kernel has no ``netem``.
    """
    if not any(s is not None and s.delay_ms for s in shapes):
        return
    probe = f"ff-probe-{secrets.token_hex(3)}"
    _ip(["netns", "add", probe])
    try:
        delay = LinkShape(delay_ms=1)
        _run(
            ["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", *qdisc_args(delay)],
            check=True,
            hint=_shape_hint(delay),
        )
    finally:
        _run(["ip", "netns", "del", probe], check=False)


def taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine's root namespace has an address or a route in."""
    found: list[ipaddress.IPv4Network] = []
    for entry in _ip_json(["-4", "addr", "show"]):
        for info in entry.get("addr_info", []):
            found.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in _ip_json(["-4", "route", "show"]):
        dst = str(route.get("dst", ""))
        if dst and dst != "default":
            found.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return found


def ensure_network(network: NetworkPlan) -> list[str]:
    """Make what is missing of ``network`` (idempotent) and set every link's shape; what was done, as lines.

    Raises:
        HostsError: an ``ip`` or ``tc`` command failed (the message has its error).
    """
    done: list[str] = []
    if not _link_exists(network.bridge):
        _ip(["link", "add", network.bridge, "type", "bridge"])
        done.append(f"bridge {network.bridge}")
    _ip(["addr", "replace", f"{network.bridge_address}/{SUBNET_PREFIX_LEN}", "dev", network.bridge])
    _ip(["link", "set", network.bridge, "up"])
    for host in network.hosts:
        if add_host(network, host):
            done.append(f"host {host.name}: namespace {network.netns(host.name)}, {host.address}")
        set_shape(network, host)
    return done


def add_host(network: NetworkPlan, host: HostPlan) -> bool:
    """Make ``host``'s namespace and its veth on the bridge when missing; whether anything was made.

    A half-made host (an earlier ``up`` stopped between making the veth pair and moving its end into the
    namespace) is repaired: the end left in this namespace is moved in.
    """
    netns, outer, inner = network.netns(host.name), network.bridge_link(host.name), network.host_link(host.name)
    made = False
    if not (_NETNS_DIR / netns).exists():
        _ip(["netns", "add", netns])
        made = True
    if _link_exists(outer) and _link_exists(inner):  # the pair was made, its end never moved into the namespace
        _ip(["link", "set", inner, "netns", netns])
        made = True
    if not _link_exists(outer):
        _ip(["link", "add", outer, "type", "veth", "peer", "name", inner])
        _ip(["link", "set", inner, "netns", netns])
        made = True
    _ip(["link", "set", outer, "master", network.bridge])
    _ip(["link", "set", outer, "up"])
    _ip(["-n", netns, "addr", "replace", f"{host.address}/{SUBNET_PREFIX_LEN}", "dev", inner])
    _ip(["-n", netns, "link", "set", inner, "up"])
    _ip(["-n", netns, "link", "set", "lo", "up"])
    return made


def set_shape(network: NetworkPlan, host: HostPlan) -> None:
    """Put ``host.shape`` on both ends of its link (egress of each end: both directions), or remove a shape."""
    ends = ((None, network.bridge_link(host.name)), (network.netns(host.name), network.host_link(host.name)))
    for netns, link in ends:
        where = ["-n", netns] if netns else []
        _run(["tc", *where, "qdisc", "del", "dev", link, "root"], check=False)
        if host.shape is not None:
            _run(
                ["tc", *where, "qdisc", "add", "dev", link, "root", *qdisc_args(host.shape)],
                check=True,
                hint=_shape_hint(host.shape),
            )


def qdisc_args(shape: LinkShape) -> list[str]:
    """The qdisc for a shape: ``netem`` when there is a delay (with the rate, if any), else ``tbf``."""
    if shape.delay_ms:
        return ["netem", "delay", f"{shape.delay_ms:g}ms", *(["rate", shape.rate] if shape.rate else [])]
    # The bucket holds at least one GSO packet of a veth (64 KiB; a larger packet than the bucket is dropped)
    # and 10 ms worth of the rate, so a fast rate is not capped by the bucket.
    burst_bytes = max(256 * 1024, int(rate_bits(shape.rate) / 8 / 100))
    return ["tbf", "rate", shape.rate, "burst", str(burst_bytes), "latency", "100ms"]


def rate_bits(rate: str) -> float:
    """``100mbit`` -> 1e8."""
    found = _RATE.match(rate)
    if found is None:
        raise HostsError(f"{rate!r} is not a rate")
    unit = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[found.group(2)]
    return float(rate.removesuffix(found.group(2))) * unit


def _shape_hint(shape: LinkShape) -> str:
    if shape.delay_ms:
        return "a delay needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM); without it give only rate=..."
    return "a rate needs the kernel's tbf qdisc (CONFIG_NET_SCH_TBF)"


def remove_network(prefix: str) -> list[str]:
    """Remove every namespace and link whose name starts with ``<prefix>-``; what was removed.

    That is the hosts, the bridge, and namespaces added for joined machines. Processes must be stopped first (a
    namespace with processes in it lives on until they exit).
    """
    if not _PREFIX.match(prefix):
        raise HostsError(f"{prefix!r} is not a cluster network prefix")
    removed: list[str] = []
    names = sorted(p.name for p in _NETNS_DIR.glob(f"{prefix}-*")) if _NETNS_DIR.exists() else []
    for netns in names:
        _run(["ip", "netns", "del", netns], check=False)
        removed.append(netns)
    for link in sorted(p.name for p in _SYS_NET.glob(f"{prefix}-*")):
        if link.endswith("-br"):
            continue
        _run(["ip", "link", "del", link], check=False)
    if _link_exists(f"{prefix}-br"):
        _run(["ip", "link", "del", f"{prefix}-br"], check=False)
        removed.append(f"{prefix}-br")
    return removed


def _link_exists(name: str) -> bool:
    return (_SYS_NET / name).exists()


def link_bytes(link: str) -> tuple[int, int]:
    """(rx, tx) bytes of a root-namespace link (a host's bridge end: rx is what the host sent)."""
    stats = _SYS_NET / link / "statistics"
    return int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())


def exec_prefix(network: NetworkPlan, host: str) -> list[str]:
    """The argv prefix that runs a command on ``host``."""
    return ["ip", "netns", "exec", network.netns(host)]


def _ip(args: list[str]) -> None:
    _run(["ip", *args], check=True)


def _ip_json(args: list[str]) -> list[dict[str, Any]]:
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    if out.returncode != 0:
        raise HostsError(f"ip {' '.join(args)} failed: {out.stderr.strip()}")
    doc: list[dict[str, Any]] = json.loads(out.stdout or "[]")
    return doc


def _run(argv: list[str], *, check: bool, hint: str = "") -> None:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    if check and out.returncode != 0:
        extra = f" ({hint})" if hint else ""
        raise HostsError(f"{' '.join(argv)} failed: {out.stderr.strip() or out.returncode}{extra}")
