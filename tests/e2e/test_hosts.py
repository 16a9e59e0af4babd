"""``fireflyer up --hosts 3``: storage and agents on three network namespaces joined by veth links to a bridge.
A chain write and a 2-node x 2-rank hfreduce allreduce cross the hosts' links (their byte counters show it);
``join`` from a fourth namespace (another machine) adds an agent the scheduler then runs a task on, and a storage
node that takes a replica; ``leave`` drains both and removes them from the cluster. One cluster for the module.
Needs root and ``ip netns``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hf3fs
from ff_appliance import hosts
from ff_appliance.hosts import HostPlan, NetworkPlan
from ff_appliance.scheduler_setup import scheduler_address, set_quota
from ff_appliance.scheduler_user import SchedulerUser, user_token
from ff_cluster import MgmtdClient
from ff_testing.environ import clean_env
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

from .conftest import Appliance


def _netns_unavailable() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth links, a bridge)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return "" if probe.returncode == 0 else f"`ip netns` does not work here: {probe.stderr.strip()}"


pytestmark = pytest.mark.skipif(bool(_netns_unavailable()), reason=_netns_unavailable() or "-")

USER = "hosts-e2e"
WRITE_BYTES = 4 << 20
ALLREDUCE_ELEMS = 1 << 20  # float32: 4 MiB per rank, three times
TASK_WAIT_S = 90.0

ALLREDUCE_SCRIPT = """
import os, numpy as np
from hfreduce import Group, GroupConfig
group = Group(GroupConfig.from_env())
expected = sum(range(1, group.world_size + 1))
for _ in range(3):
    buf = np.full({elems}, float(group.rank + 1), dtype=np.float32)
    group.allreduce(buf)
    assert float(buf.min()) == float(buf.max()) == expected, (buf.min(), buf.max())
print(f"allreduce ok rank {{group.rank}} of {{group.world_size}} sum {{expected}} from {{os.environ['MASTER_IP']}}")
group.close()
"""
# Prints the address this rank's node reaches rank 0's at (its own host's), then sleeps.
SLEEP_SCRIPT = """
import os, socket, time
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.connect((os.environ["MASTER_IP"], 9))
    print("on", s.getsockname()[0], flush=True)
time.sleep({seconds})
"""


class Cluster:
    def __init__(self, app: Appliance) -> None:
        self.app = app
        plan = json.loads((app.state_dir / "plan.json").read_text())
        self.plan = plan
        self.network = NetworkPlan.from_dict(plan["network"])
        self.mgmtd = [f"{i['host']}:{i['grpc_port']}" for i in plan["instances"] if i["service"] == "mgmtd"]
        self.admin_token = (app.state_dir / "secrets" / "admin_token").read_text().strip()
        self.cluster_token = (app.state_dir / "secrets" / "cluster_token").read_text().strip()

    def link_bytes(self) -> dict[str, tuple[int, int]]:
        """Per host: (bytes it received, bytes it sent) on its link (the bridge end's tx and rx)."""
        out = {}
        for h in self.network.hosts:
            rx, tx = hosts.link_bytes(self.network.bridge_link(h.name))
            out[h.name] = (tx, rx)
        return out

    async def user(self) -> SchedulerUser:
        mgmtd = MgmtdClient(self.mgmtd, token=self.admin_token)
        try:
            address = await scheduler_address(mgmtd)
            token = await user_token(mgmtd, USER)
        finally:
            await mgmtd.close()
        await set_quota(address, self.admin_token, USER, 10, 4)
        return SchedulerUser(address, token, timeout_s=10.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    app = Appliance(tmp_path_factory.mktemp("hosts") / "state")
    try:
        app.ok("up", "--hosts", "3", "--link-shape", "h3:rate=1gbit", "--timeout-s", "150", timeout_s=180.0)
        yield Cluster(app)
    finally:
        if app.state_dir.exists():
            prefix = json.loads((app.state_dir / "plan.json").read_text()).get("network", {}).get("prefix", "")
            app.down_and_check()
            if prefix:
                assert not list(Path("/run/netns").glob(f"{prefix}-*")), "down left namespaces"
                assert not list(Path("/sys/class/net").glob(f"{prefix}-*")), "down left links"


def test_instances_are_placed_on_hosts_and_status_shows_them(cluster: Cluster) -> None:
    placed = {i["name"]: (i["host_name"], i["host"]) for i in cluster.plan["instances"]}
    net = cluster.network
    assert {n: h for n, (h, _) in placed.items() if h} == {
        "storage-1": "h1", "storage-2": "h2", "storage-3": "h3", "agent-1": "h1", "agent-2": "h2",
    }  # fmt: skip
    assert placed["mgmtd-1"] == ("", net.bridge_address)
    assert placed["storage-3"] == ("h3", f"{net.subnet}.13")
    status = cluster.app.run("status", "--json")
    assert status.code == 0, status.out
    assert {s["instance"]: s["host"] for s in status.json()["services"]}["agent-2"] == "h2"
    # every host's services run in its namespace (their pids are listed there)
    for name in ("storage-2", "agent-2"):
        pid = cluster.app.pids()[name]
        assert os.readlink(f"/proc/{pid}/ns/net") == _netns_inode("h2", net)
    shaped = subprocess.run(["tc", "qdisc", "show", "dev", net.bridge_link("h3")], capture_output=True, text=True,
                            check=True).stdout  # fmt: skip
    assert "tbf" in shaped and "rate 1Gbit" in shaped, shaped


def _netns_inode(host: str, net: NetworkPlan) -> str:
    inode = os.stat(f"/run/netns/{net.netns(host)}").st_ino
    return f"net:[{inode}]"


def test_a_chain_write_and_its_read_cross_the_host_links(cluster: Cluster) -> None:
    data = os.urandom(WRITE_BYTES)
    before = cluster.link_bytes()
    with hf3fs.connect(mgmtd=cluster.mgmtd, token=cluster.admin_token) as fs:
        with fs.open("/hosts-e2e.bin", "wb") as f:
            f.write(data)
        written = cluster.link_bytes()
        with fs.open("/hosts-e2e.bin", "rb") as f:
            assert f.read() == data
        read = cluster.link_bytes()
    # 3 storage nodes, chains of 3: every chunk reaches every host once (from this machine at the head, then
    # forwarded along the chain), so each host received at least the file's bytes over its link.
    received = {h: written[h][0] - before[h][0] for h in written}
    print(f"chain write of {WRITE_BYTES} bytes: bytes each host received over its link {received}")
    assert all(n >= WRITE_BYTES for n in received.values()), received
    # The read: each chunk from one replica, all of it out of the hosts' links to this machine.
    sent = {h: read[h][1] - written[h][1] for h in read}
    print(f"read of {WRITE_BYTES} bytes: bytes each host sent over its link {sent}")
    assert sum(sent.values()) >= WRITE_BYTES, sent


async def test_a_2x2_hfreduce_allreduce_crosses_the_agents_hosts(cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT.format(elems=ALLREDUCE_ELEMS))
    os.chmod(tmp_path, 0o755)  # the ranks may run as the task's user
    user = await cluster.user()
    try:
        before = cluster.link_bytes()
        spec = pb.TaskSpec(name="allreduce", argv=["python", str(script)], num_nodes=2, priority=10)
        task = (await user.scheduler.submit_task(pb.SubmitTaskRequest(spec=spec))).task
        done = await _wait_ended(user, task.task_id)
        after = cluster.link_bytes()
        logs = [await user.log(task.task_id, r) for r in (0, 1)]
        assert done.state == pb.TASK_STATE_SUCCEEDED, (done.end_message, logs)
    finally:
        await user.close()
    assert sum(line.count("allreduce ok") for line in logs) == 4, logs
    buffer_bytes = 4 * ALLREDUCE_ELEMS * 3
    moved = {h: (after[h][0] - before[h][0], after[h][1] - before[h][1]) for h in after}
    print(f"3 allreduces of {4 * ALLREDUCE_ELEMS} bytes per rank: (received, sent) per host link {moved}")
    # agent-1 on h1, agent-2 on h2: each node's partial sums go to the other node and the other's come back, so
    # the buffer's bytes cross each of the two links both ways (measured: 12.0 MiB each way for 3 x 4 MiB); h3
    # has no agent and sees only routine control traffic.
    for host in ("h1", "h2"):
        assert moved[host][0] >= buffer_bytes and moved[host][1] >= buffer_bytes, (host, moved)
    assert sum(moved["h3"]) < buffer_bytes / 10, moved


async def _wait_ended(user: SchedulerUser, task_id: int) -> pb.Task:
    return await _wait_for(user, task_id, lambda t: t.state >= pb.TASK_STATE_SUCCEEDED)


async def _wait_for(user: SchedulerUser, task_id: int, done: Callable[[pb.Task], bool]) -> pb.Task:
    deadline = time.monotonic() + TASK_WAIT_S
    while True:
        task = await user.task(task_id)
        if done(task):
            return task
        assert time.monotonic() < deadline, f"task {task_id}: not there after {TASK_WAIT_S:g}s: {task}"
        await asyncio.sleep(0.3)


async def _wait_log(user: SchedulerUser, task_id: int, node_rank: int, text: str) -> None:
    deadline = time.monotonic() + TASK_WAIT_S
    while text not in await user.log(task_id, node_rank):
        assert time.monotonic() < deadline, f"task {task_id}: node rank {node_rank} never printed {text!r}"
        await asyncio.sleep(0.3)


def _fireflyer(*args: str, netns: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "fireflyer"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "ff_appliance"]
    return subprocess.run(["ip", "netns", "exec", netns, *argv, *args], capture_output=True, text=True,
                          env=clean_env(), timeout=timeout_s, check=False)  # fmt: skip


async def test_join_adds_a_node_the_scheduler_uses_and_leave_drains_and_removes_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    net = cluster.network
    machine = HostPlan(name="j1", address=f"{net.subnet}.{hosts.JOIN_ADDRESS_OFFSET + 1}")
    hosts.add_host(net, machine)  # "another machine" on the cluster's network; `down` removes it with the rest
    state = tmp_path / "joined"
    joined = _fireflyer("join", "--mgmtd", cluster.mgmtd[0], "--token", cluster.cluster_token, "--agent", "--storage",
                        str(tmp_path / "disk"), "--state-dir", str(state), netns=net.netns("j1"))  # fmt: skip
    try:
        assert joined.returncode == 0, joined.stdout + joined.stderr
        assert "devices: no GPU" in joined.stdout and "replica of node" in joined.stdout, joined.stdout
        assert "ready in the scheduler (2 devices)" in joined.stdout, joined.stdout
        plan = json.loads((state / "plan.json").read_text())
        node_ids = {i["service"]: i["node_id"] for i in plan["instances"]}
        assert all(i["host"] == machine.address for i in plan["instances"])
        routing = await _routing(cluster)
        assert any(t.node_id == node_ids["storage"] for c in routing.chains for t in c.targets)
        status = _fireflyer("status", "--json", "--state-dir", str(state), netns=net.netns("j1"))
        assert status.returncode == 0, status.stdout + status.stderr  # its two nodes, alive in the cluster's mgmtd
        assert [(r["instance"], r["health"]) for r in json.loads(status.stdout)["services"]] == [
            ("agent-1", "SERVING"), ("storage-1", "SERVING"),
        ]  # fmt: skip
        # 3 nodes: agent-1, agent-2 and the joined one; the task outlives the test unless leave suspends it
        user = await cluster.user()
        try:
            script = tmp_path / "sleep.py"
            script.write_text(SLEEP_SCRIPT.format(seconds=300))
            spec = pb.TaskSpec(name="three", argv=["python", str(script)], num_nodes=3, priority=10)
            task = (await user.scheduler.submit_task(pb.SubmitTaskRequest(spec=spec))).task
            running = await _wait_for(user, task.task_id, lambda t: t.current_run.state == pb.RUN_STATE_RUNNING)
            on_joined = [n.node_rank for n in running.current_run.nodes if n.node_id == node_ids["agent"]]
            assert on_joined, running.current_run
            await _wait_log(user, task.task_id, on_joined[0], f"on {machine.address}")  # ranks on the joined machine
            leave_started = time.monotonic()
            left = await asyncio.to_thread(_fireflyer, "leave", "--state-dir", str(state), netns=net.netns("j1"))
            assert left.returncode == 0, left.stdout + left.stderr
            print(f"leave took {time.monotonic() - leave_started:.1f}s:", *_lines_with("dead in mgmtd", left.stdout))
            assert "runs on it are suspended" in left.stdout and "drained" in left.stdout, left.stdout
            assert "synced and serving" in left.stdout, left.stdout
            for service, node_id in node_ids.items():
                assert f"node {node_id} ({service}-1): removed from mgmtd" in left.stdout, left.stdout
            assert f"node {node_ids['agent']}: gone from the scheduler's nodes" in left.stdout, left.stdout
            after = await user.task(task.task_id)
            assert after.runs[0].state != pb.RUN_STATE_RUNNING and after.current_run.state != pb.RUN_STATE_RUNNING
            nodes = {n.node_id for n in (await user.scheduler.list_nodes(pb.ListNodesRequest())).nodes}
            assert node_ids["agent"] not in nodes and len(nodes) == 2, nodes  # forgotten: agent-1 and agent-2 left
            await user.scheduler.stop_task(pb.StopTaskRequest(task_id=task.task_id))  # 2 nodes left: it would wait
        finally:
            await user.close()
        routing = await _routing(cluster)
        assert not any(t.node_id == node_ids["storage"] for c in routing.chains for t in c.targets)
        assert all(t.public_state == mgmtd_pb2.PUBLIC_TARGET_STATE_SERVING for c in routing.chains for t in c.targets)
        assert not set(node_ids.values()) & {n.node_id for n in routing.nodes}  # removed from mgmtd
    finally:
        _stop_leftovers(state)


def _lines_with(text: str, out: str) -> list[str]:
    return [line for line in out.splitlines() if text in line]


async def _routing(cluster: Cluster) -> Any:
    client = MgmtdClient(cluster.mgmtd, token=cluster.admin_token)
    try:
        return (await client.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
    finally:
        await client.close()


def _stop_leftovers(state: Path) -> None:
    """A failed test must not leave the joined services running."""
    for pid_file in (state / "run").glob("*.pid") if (state / "run").exists() else []:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
