"""The hosts' network layout (``up --hosts``): subnet choice, names and addresses, link shapes, placement of the
plan's instances, and the plan file round trip. Pure: no namespace is made."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from ff_appliance import host_layout, hosts
from ff_appliance.hosts import (
    HostPlan,
    HostsError,
    LinkShape,
    NetworkPlan,
    host_of,
    new_network,
    parse_host_zone,
    parse_link_shape,
    qdisc_args,
    rate_bits,
    with_shapes,
    with_zones,
)
from ff_appliance.services import LaunchContext, command, spec_for
from ff_appliance.state import ClusterPlan, InstancePlan, StateDir, extend_plan, load_plan, place_on_hosts, save_plan


def _net(text: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(text)


def test_new_network_names_and_addresses() -> None:
    net = new_network(3, [], short_id="0a0b0c")
    assert net.prefix == "ff-0a0b0c" and net.bridge == "ff-0a0b0c-br"
    first, second, third = net.subnet.split(".")
    assert first == "10" and 64 <= int(second) < 254 and 0 <= int(third) < 256
    assert net.bridge_address == f"{net.subnet}.1"
    assert [(h.name, h.address) for h in net.hosts] == [(f"h{i}", f"{net.subnet}.{10 + i}") for i in (1, 2, 3)]
    assert (net.netns("h2"), net.bridge_link("h2"), net.host_link("h2")) == (
        "ff-0a0b0c-h2",
        "ff-0a0b0c-h2v",
        "ff-0a0b0c-h2p",
    )
    # Linux interface names are at most 15 characters, even with the most hosts
    assert len(new_network(50, [], short_id="ffffff").bridge_link("h50")) <= 15


def test_new_network_avoids_the_machines_networks() -> None:
    first = new_network(2, [], short_id="123456")
    taken = [_net(f"{first.subnet}.0/24"), _net("10.0.0.0/9")]
    other = new_network(2, taken, short_id="123456")
    assert other.subnet != first.subnet
    assert not any(_net(f"{other.subnet}.0/24").overlaps(t) for t in taken)


def test_new_network_refuses_too_many_hosts_or_no_room() -> None:
    with pytest.raises(HostsError, match="1 to 50 hosts"):
        new_network(51, [])
    with pytest.raises(HostsError, match="no free"):
        new_network(2, [_net("10.0.0.0/8")])


def test_link_shape_parsing() -> None:
    assert parse_link_shape("rate=100mbit,delay=2ms") == (None, LinkShape(rate="100mbit", delay_ms=2.0))
    assert parse_link_shape("h3:rate=1gbit") == ("h3", LinkShape(rate="1gbit"))
    assert parse_link_shape("h2:none") == ("h2", None)
    assert parse_link_shape("delay=0.5ms") == (None, LinkShape(delay_ms=0.5))
    assert LinkShape(rate="1mbit", delay_ms=0.5).describe() == "rate=1mbit,delay=0.5ms"
    for bad in ("", "rate=fast", "h3:", "bandwidth=1mbit", "zone-a:rate=1mbit", "delay=2s"):
        with pytest.raises(HostsError):
            parse_link_shape(bad)


def test_qdisc_for_a_rate_is_tbf_with_a_bucket_above_a_gso_packet_and_netem_for_a_delay() -> None:
    assert rate_bits("100mbit") == 1e8 and rate_bits("2.5gbit") == 2.5e9
    tbf = qdisc_args(LinkShape(rate="10mbit"))
    assert tbf[:3] == ["tbf", "rate", "10mbit"] and int(tbf[tbf.index("burst") + 1]) >= 64 * 1024
    assert int(qdisc_args(LinkShape(rate="10gbit"))[4]) == int(10e9 / 8 / 100)  # 10 ms at the rate
    assert qdisc_args(LinkShape(rate="1mbit", delay_ms=20)) == ["netem", "delay", "20ms", "rate", "1mbit"]


def test_shapes_for_every_host_then_one_named_host() -> None:
    net = new_network(3, [], short_id="000001")
    shaped = with_shapes(net, [("h3", LinkShape(rate="10mbit", delay_ms=20)), (None, LinkShape(rate="1gbit"))])
    assert [h.shape for h in shaped.hosts] == [
        LinkShape(rate="1gbit"),
        LinkShape(rate="1gbit"),
        LinkShape(rate="10mbit", delay_ms=20),
    ]
    assert with_shapes(shaped, [("h3", None)]).hosts[2].shape is None  # unshaped again, the others kept
    assert with_shapes(shaped, [("h3", None)]).hosts[0].shape == LinkShape(rate="1gbit")
    with pytest.raises(HostsError, match="no host named 'h9'"):
        with_shapes(net, [("h9", LinkShape(rate="1mbit"))])


def test_storage_and_agents_round_robin_over_hosts_the_rest_on_the_bridge() -> None:
    net = new_network(3, [], short_id="000002")
    assert [host_of("storage", f"storage-{i}", net).name for i in range(1, 6)] == ["h1", "h2", "h3", "h1", "h2"]  # type: ignore[union-attr]
    assert host_of("agent", "agent-2", net) == net.hosts[1]
    assert host_of("mgmtd", "mgmtd-1", net) is None


def _ports(count: int, exclude: set[int]) -> list[int]:
    start = max(exclude, default=20000) + 1
    return list(range(start, start + count))


DEFAULTS = {"mgmtd": 1, "storage": 3, "meta": 1, "agent": 2}


def test_place_on_hosts_moves_loopback_instances_keeps_placed_ones_and_survives_the_plan_file() -> None:
    net = new_network(2, [], short_id="000003")
    plan = place_on_hosts(extend_plan(None, {}, DEFAULTS, _ports), net)
    where = {i.name: (i.host_name, i.host) for i in plan.instances}
    assert where["mgmtd-1"] == ("", net.bridge_address) and where["meta-1"] == ("", net.bridge_address)
    assert where["storage-3"] == ("h1", net.hosts[0].address) and where["agent-2"] == ("h2", net.hosts[1].address)
    assert place_on_hosts(plan, net) == plan  # nothing left to place
    grown = place_on_hosts(extend_plan(plan, {"agent": 3}, DEFAULTS, _ports), net)
    assert grown.instances[: len(plan.instances)] == plan.instances
    assert (grown.find("agent-3").host_name, grown.network) == ("h1", net)
    assert ClusterPlan.from_json(grown.to_json()) == grown


def test_a_plan_without_network_reads_as_before() -> None:
    plan = ClusterPlan(
        instances=(InstancePlan(name="mgmtd-1", service="mgmtd", node_id=1, grpc_port=1, metrics_port=2),)
    )
    doc = json.loads(plan.to_json())
    assert "network" not in doc
    del doc["instances"][0]["host_name"]  # a plan written before --hosts
    assert ClusterPlan.from_json(json.dumps(doc)) == plan


def test_network_plan_round_trip_with_shapes() -> None:
    net = NetworkPlan(
        prefix="ff-abcdef",
        subnet="10.70.1",
        hosts=(
            HostPlan(name="h1", address="10.70.1.11", shape=LinkShape(rate="5mbit", delay_ms=3)),
            HostPlan(name="h2", address="10.70.1.12"),
        ),
    )
    assert NetworkPlan.from_dict(net.to_dict()) == net


@pytest.mark.parametrize(("prefix", "host"), [("ff-*", "h1"), ("ff", "h1"), ("eth0", "h1"), ("ff-abcdef", "h1 x")])
def test_a_plan_naming_what_fireflyer_did_not_make_is_refused(prefix: str, host: str) -> None:
    doc = {"prefix": prefix, "subnet": "10.70.1", "hosts": [{"name": host, "address": "10.70.1.11"}]}
    with pytest.raises(ValueError, match="not a network made by fireflyer"):  # its names would go to `ip ... del`
        NetworkPlan.from_dict(doc)
    with pytest.raises(HostsError, match="not a cluster network prefix"):
        hosts.remove_network(prefix) if host == "h1" else hosts.remove_network("ff-*")


def test_choose_network_refusals_change_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = StateDir(tmp_path)
    shape = [(None, LinkShape(rate="1mbit"))]
    with pytest.raises(HostsError, match="--link-shape and --host-zone are about the hosts of --hosts"):
        host_layout.choose_network(state, None, shape)
    assert host_layout.choose_network(state, None, []) is None
    save_plan(state, extend_plan(None, {}, DEFAULTS, _ports))  # a cluster on loopback
    with pytest.raises(HostsError, match="--hosts is for a new cluster"):
        host_layout.choose_network(state, 3, [])
    net = new_network(3, [], short_id="000004")
    on_hosts = place_on_hosts(extend_plan(None, {}, DEFAULTS, _ports), net)
    save_plan(state, on_hosts)
    with pytest.raises(HostsError, match="runs on 3 hosts"):
        host_layout.choose_network(state, 2, [])
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 1000)
    with pytest.raises(HostsError, match="needs root"):
        host_layout.choose_network(state, None, [])
    assert load_plan(state) == on_hosts


def test_host_zones_parse_apply_and_reach_the_agents_command_line(tmp_path: Path) -> None:
    assert parse_host_zone("h3=far") == ("h3", "far") and parse_host_zone("h3=") == ("h3", "")
    for bad in ("h3", "far", "h3=a b", "=far"):
        with pytest.raises(HostsError, match="HOST=ZONE"):
            parse_host_zone(bad)
    net = with_zones(new_network(3, [], short_id="000005"), [("h3", "far")])
    assert [h.zone for h in net.hosts] == ["", "", "far"]
    assert NetworkPlan.from_dict(net.to_dict()) == net
    with pytest.raises(HostsError, match="no host named"):
        with_zones(net, [("h4", "far")])
    plan = place_on_hosts(extend_plan(None, {"agent": 3}, DEFAULTS, _ports), net)
    ctx = LaunchContext(state=StateDir(tmp_path), plan=plan)
    argv = {i.name: command(spec_for(i), ctx, i) for i in plan.of_service("agent")}
    assert argv["agent-3"][:4] == ["ip", "netns", "exec", net.netns("h3")]  # agent-3 runs on h3
    assert argv["agent-3"][argv["agent-3"].index("--zone") + 1] == "far"
    assert "--zone" not in argv["agent-1"]
