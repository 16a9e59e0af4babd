"""Wire the agent: devices, runs, scheduler link and validator on the service chassis."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
from pathlib import Path

from ff_agent import devices
from ff_agent.app import Agent, NodeIdentity
from ff_agent.config import AgentSettings
from ff_agent.core.launch import MAX_REQUEST_BYTES, NodeFacts, RanksRunAs
from ff_agent.errors import STATUS_TABLE
from ff_agent.link import LINK_ERRORS, SchedulerLink
from ff_agent.node_metrics import NodeMetrics
from ff_agent.procs import closed_ancestor
from ff_agent.runs import NodeRuns, RunsOptions
from ff_agent.servicer import AgentServicer
from ff_agent.validator import Validator, ValidatorOptions
from ff_cluster import MgmtdClient, ServiceWiring, Serving, registry_validator, serve_service
from ff_cluster.chassis import Loop
from ff_rpc import ServiceBinding
from ff_telemetry_client import service_reporter
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc
from fireflyer.common.v1 import common_pb2

logger = logging.getLogger(__name__)


def _validator_options(settings: AgentSettings, num_devices: int) -> ValidatorOptions:
    return ValidatorOptions(
        work_dir=settings.state_dir / "validator",
        memory_bytes=settings.validator_memory_bytes,
        disk_bytes=settings.validator_disk_bytes,
        gemm_size=settings.validator_gemm_size,
        min_memory_bandwidth_gbps=settings.min_memory_bandwidth_gbps,
        min_disk_throughput_mbps=settings.min_disk_throughput_mbps,
        min_cpu_gflops=settings.min_cpu_gflops,
        num_local_ranks=num_devices,
        python_executable=settings.python_executable,
        forced_failures=settings.forced_failures(),
    )


async def main(settings: AgentSettings, stop: asyncio.Event | None = None) -> None:
    """Serve the agent until ``stop`` is set (or a signal): register, supervise runs, then stop them all.

    Raises:
        RuntimeError: ranks must run as their task's user but the state folder keeps those users out.
    """
    stop = stop or asyncio.Event()
    cluster_token = settings.resolved_cluster_token()
    mgmtd_addresses = settings.mgmtd_address_list()
    mgmtd = MgmtdClient(mgmtd_addresses, token=cluster_token, timeout_s=settings.call_timeout_s)
    link = SchedulerLink(cluster_token, mgmtd, settings.scheduler_address, settings.call_timeout_s)
    node_devices = await asyncio.to_thread(devices.detect, settings.detect_gpus, settings.num_device_slots)
    hostname = settings.hostname or socket.gethostname() + (f"-{settings.instance_id}" if settings.instance_id else "")
    facts = NodeFacts(
        hostname=hostname,
        device_indices=tuple(d.index for d in node_devices),
        gpus=any(d.gpu for d in node_devices),
        scheduler_address=settings.scheduler_address,
        mgmtd_addresses=",".join(mgmtd_addresses),
        zone=settings.zone,
    )
    runs = NodeRuns(
        RunsOptions(
            state_dir=settings.state_dir,
            term_grace_s=settings.term_grace_s,
            python_executable=settings.python_executable,
            base_env=dict(os.environ),
        ),
        facts,
        link,
    )
    ranks_run_as = ranks_run_as_at_start(settings)
    killed = runs.kill_leftovers()
    if killed:
        logger.warning("killed %d processes left by a previous agent on this node", killed)
    validator = Validator(_validator_options(settings, len(node_devices)), mgmtd, settings.call_timeout_s)
    tokens = registry_validator(mgmtd, settings.token_cache_ttl_s)
    agent = Agent(settings, NodeIdentity(hostname=hostname, devices=node_devices), runs, link, validator, tokens)
    agent.ranks_run_as = ranks_run_as

    async def on_bound(address: str) -> None:
        agent.identity.address = address

    def loops_after_registration(serving: Serving) -> list[Loop]:
        agent.node_id = link.node_id = serving.node_id
        loops = [agent.poll_loop(stop), agent.report_loop(stop), agent.validator_loop(stop), agent.hang_loop(stop)]
        if settings.telemetry_interval_s > 0:
            node = NodeMetrics(settings.state_dir)
            loops.append(
                service_reporter(
                    service="agent",
                    node_id=agent.node_id,
                    hostname=hostname,
                    mgmtd_addresses=mgmtd_addresses,
                    token=cluster_token,
                    collect=node.collect,
                    interval_s=settings.telemetry_interval_s,
                ).run(stop)
            )
        return loops

    async def on_stop(serving: Serving) -> None:
        await runs.shutdown(settings.term_grace_s)
        await runs.mark_changed()

    wiring = ServiceWiring(
        node_type=common_pb2.NODE_TYPE_AGENT,
        bindings=[
            ServiceBinding(
                agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
                agent_pb2_grpc.add_AgentServiceServicer_to_server,
                AgentServicer(agent),
            )
        ],
        status_table=STATUS_TABLE,
        token_validator=tokens,
        max_request_bytes=MAX_REQUEST_BYTES,
        mgmtd_addresses=mgmtd_addresses,
        mgmtd_client=mgmtd,
        hostname=hostname,
        default_instance_id=hostname,
        tags={"num_devices": str(len(node_devices))},
        on_bound=on_bound,
        loops_after_registration=loops_after_registration,
        ready_info=lambda serving: {"hostname": hostname},
        on_stop=on_stop,
    )
    try:
        await serve_service(settings, wiring, stop)
    finally:
        await _final_report(agent)
        await link.close()
        await mgmtd.close()
    logger.info("agent stopped")


def ranks_run_as_at_start(settings: AgentSettings) -> RanksRunAs:
    """Whose uid the ranks get, decided (and logged) once at start.

    ``auto`` is ``task-user`` when the agent is root and both its state folder and its interpreter are open to
    every user, else ``agent-user``.

    Raises:
        RuntimeError: ``task-user`` as root, and the task users could not reach their run folders (a folder
            above ``state_dir`` without o+x).
    """
    uid, mode = os.geteuid(), settings.ranks_run_as
    closed_state, closed_python = _closed_state_dir(settings), _closed_python(settings)
    if mode is RanksRunAs.AUTO:
        why = "not root" if uid != 0 else closed_state or closed_python
        mode = RanksRunAs.AGENT_USER if why else RanksRunAs.TASK_USER
        if why:
            logger.warning("ranks_run_as=auto: %s, so ranks cannot run as their task's user", why)
    if mode is RanksRunAs.AGENT_USER:
        logger.warning("ranks of every user run as this agent's uid %d: users are not isolated from each other", uid)
    elif uid != 0:
        logger.warning(
            "not root (uid %d): only tasks of users with uid %d run here, others are refused "
            "(ranks_run_as=agent-user runs every rank as this agent instead)",
            uid,
            uid,
        )
    elif closed_state:
        raise RuntimeError(f"ranks_run_as=task-user: {closed_state}; use a state_dir every user can traverse")
    else:
        if closed_python:
            logger.warning("%s: their `python` tasks will fail", closed_python)
        logger.info("ranks run as their task's user (uid, gid and groups from the identity registry)")
    return mode


def _closed_state_dir(settings: AgentSettings) -> str:
    closed = closed_ancestor(settings.state_dir.resolve())
    if closed is None:
        return ""
    return f"{closed} (mode {closed.stat().st_mode & 0o777:o}) keeps task users out of {settings.state_dir}"


def _closed_python(settings: AgentSettings) -> str:
    python = Path(settings.python_executable).resolve()
    if closed_ancestor(python.parent) is None and python.stat().st_mode & stat.S_IXOTH:
        return ""
    return f"task users cannot run python_executable {python}"


async def _final_report(agent: Agent, timeout_s: float = 3.0) -> None:
    """Tell the scheduler the runs ended here, best effort.

    The agent is going away: a scheduler that is gone or does not answer within ``timeout_s`` does not keep it
    from stopping cleanly.
    """
    pending = [r.report(agent.node_id) for r in agent.runs.runs.values() if not r.final_reported]
    if pending and agent.node_id:
        try:
            await asyncio.wait_for(agent.link.report_runs(pending), timeout_s)
        except (*LINK_ERRORS, TimeoutError) as err:
            logger.warning("the final report of %d run(s) did not reach the scheduler: %r", len(pending), err)
