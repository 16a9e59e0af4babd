"""The agent's settings (env prefix FF_AGENT_)."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field

from ff_agent.core.launch import RanksRunAs
from ff_config import MgmtdClientSettings

ENV_PREFIX = "FF_AGENT_"


class AgentSettings(MgmtdClientSettings):
    """The agent's settings, loaded once in ``__main__`` from ``FF_AGENT_*`` and the command line."""

    state_dir: Path = Field(Path("./agent-state"), description="run folders (control, logs, work) live here")
    scheduler_address: str = Field("", description="the scheduler's gRPC address; empty: found through mgmtd")
    hostname: str = Field("", description="the node's name; default: the host name (+ instance id)")
    master_ip: str = Field("127.0.0.1", description="the IP other nodes reach this node's ranks at (MASTER_IP)")
    zone: str = Field("", description="network zone (at most one task spans zones)")
    node_group: str = Field("", description="node group; empty: the scheduler's default")
    detect_gpus: bool = Field(True, description="use the GPUs torch sees as the devices when there are any")
    num_device_slots: int = Field(2, ge=1, le=256, description="CPU device slots when the node has no GPU")
    ranks_run_as: RanksRunAs = Field(
        RanksRunAs.TASK_USER,
        description="task-user: ranks run as the task's user (uid and groups from the identity registry; needs "
        "root, else only that uid's tasks run); agent-user: every rank as the agent's own user (no isolation); "
        "auto: task-user when root and the state folder and python are open to every user, else agent-user",
    )
    term_grace_s: float = Field(10.0, ge=0, description="SIGTERM-to-SIGKILL delay when an order gives none")
    poll_interval_s: float = Field(0.2, gt=0, description="how often ranks, SDK events and deadlines are checked")
    report_interval_s: float = Field(5.0, gt=0, description="periodic run reports (the scheduler may ask for less)")
    python_executable: str = Field(sys.executable, description="what a task's `python` / `python3` runs")
    log_retention_s: float = Field(7 * 24 * 3600.0, gt=0, description="run folders of ended runs are kept this long")
    validator_interval_s: float = Field(
        7 * 24 * 3600.0, ge=0, description="run the validator this often when idle (the paper: weekly); 0 disables"
    )
    validate_at_start: bool = Field(False, description="run the validator once at start")
    validator_force_fail: str = Field(
        "", description="TEST SWITCH: comma-separated check names forced to fail (off when empty)"
    )
    validator_memory_bytes: int = Field(64 << 20, gt=0, description="buffer of the memory bandwidth and pattern tests")
    validator_disk_bytes: int = Field(32 << 20, gt=0, description="file size of the disk throughput test")
    validator_gemm_size: int = Field(256, gt=0, description="n of the n x n matrix multiply check")
    min_memory_bandwidth_gbps: float = Field(0.2, ge=0, description="memory copy below this fails (GB/s)")
    min_disk_throughput_mbps: float = Field(5.0, ge=0, description="disk write+read below this fails (MB/s)")
    min_cpu_gflops: float = Field(0.05, ge=0, description="CPU stress below this fails (GFLOP/s)")
    hang_detection: bool = Field(
        True, description="read hfreduce's collective progress on MASTER_IP:MASTER_PORT of running runs"
    )
    hang_threshold_s: float = Field(60.0, gt=0, description="a rank this far behind the others' collective is hung")
    hang_check_interval_s: float = Field(5.0, gt=0, description="how often collective progress is read")
    telemetry_interval_s: float = Field(
        10.0, ge=0, description="push the node's CPU, memory, disk, network and GPU series this often; 0: never"
    )
    call_timeout_s: float = Field(5.0, gt=0, description="deadline of calls to mgmtd and the scheduler")

    def forced_failures(self) -> frozenset[str]:
        """The validator check names ``validator_force_fail`` forces to fail (a test switch; empty in production)."""
        return frozenset(c.strip() for c in self.validator_force_fail.split(",") if c.strip())
