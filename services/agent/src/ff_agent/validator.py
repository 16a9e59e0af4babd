"""The node validator: the paper's weekly checks, adapted to a CPU node.

CPU stress, memory bandwidth, a memory pattern test over every byte of a buffer, disk throughput with a
read-back check, a matrix multiply checked against a float64 reference, an intra-node hfreduce allreduce, and
storage reachability (mgmtd's routing info and each alive storage service's health).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ff_agent.core.errors import InvalidRequest
from ff_cluster import MgmtdClient
from ff_rpc import open_channel
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

logger = logging.getLogger(__name__)

CPU_STRESS = "cpu_stress"
MEMORY_BANDWIDTH = "memory_bandwidth"
MEMORY_PATTERN = "memory_pattern"
DISK_THROUGHPUT = "disk_throughput"
GEMM = "gemm"
ALLREDUCE = "allreduce"
STORAGE_REACHABILITY = "storage_reachability"
ALL_CHECKS = (CPU_STRESS, MEMORY_BANDWIDTH, MEMORY_PATTERN, DISK_THROUGHPUT, GEMM, ALLREDUCE, STORAGE_REACHABILITY)


@dataclass(frozen=True, kw_only=True)
class ValidatorOptions:
    """Sizes and pass thresholds of the checks (from ``AgentSettings``); ``forced_failures`` is a test switch."""

    work_dir: Path
    memory_bytes: int
    disk_bytes: int
    gemm_size: int
    min_memory_bandwidth_gbps: float
    min_disk_throughput_mbps: float
    min_cpu_gflops: float
    num_local_ranks: int
    python_executable: str
    forced_failures: frozenset[str]


def _result(name: str, passed: bool, value: float, threshold: float, unit: str, message: str) -> pb.CheckResult:
    return pb.CheckResult(name=name, passed=passed, value=value, threshold=threshold, unit=unit, message=message)


def _cpu_stress(o: ValidatorOptions) -> pb.CheckResult:
    n, reps = 1 << 21, 20
    x = np.full(n, 0.5)
    started = time.perf_counter()
    wrong = sum(1 for _ in range(reps) if float(np.dot(x, x)) != n * 0.25)
    gflops = 2 * n * reps / (time.perf_counter() - started) / 1e9
    ok = wrong == 0 and gflops >= o.min_cpu_gflops
    msg = f"{wrong} wrong dot products of {reps}" if wrong else f"{gflops:.2f} GFLOP/s"
    return _result(CPU_STRESS, ok, gflops, o.min_cpu_gflops, "GFLOP/s", msg)


def _memory_bandwidth(o: ValidatorOptions) -> pb.CheckResult:
    src = np.arange(o.memory_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    reps = 5
    started = time.perf_counter()
    for _ in range(reps):
        np.copyto(dst, src)
    gbps = 2 * src.nbytes * reps / (time.perf_counter() - started) / 1e9
    same = bool(np.array_equal(dst, src))
    ok = same and gbps >= o.min_memory_bandwidth_gbps
    return _result(
        MEMORY_BANDWIDTH,
        ok,
        gbps,
        o.min_memory_bandwidth_gbps,
        "GB/s",
        f"copy {gbps:.2f} GB/s (read + write)" if same else "copied data differs",
    )


def _memory_pattern(o: ValidatorOptions) -> pb.CheckResult:
    buf = np.empty(o.memory_bytes, dtype=np.uint8)
    bad = 0
    for pattern in (0x00, 0xFF, 0xAA, 0x55):
        buf.fill(pattern)
        bad += int(np.count_nonzero(buf != pattern))
    words = buf[: len(buf) // 4 * 4].view(np.uint32)
    words[:] = np.arange(len(words), dtype=np.uint32)
    bad += int(np.count_nonzero(words != np.arange(len(words), dtype=np.uint32)))
    return _result(
        MEMORY_PATTERN, bad == 0, float(bad), 0.0, "bad bytes", f"{o.memory_bytes} bytes x 5 patterns, {bad} mismatches"
    )


def _disk_throughput(o: ValidatorOptions) -> pb.CheckResult:
    o.work_dir.mkdir(parents=True, exist_ok=True)
    path = o.work_dir / "validator-disk.bin"
    block = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    blocks = max(1, o.disk_bytes // len(block))
    written, read = hashlib.sha256(), hashlib.sha256()
    started = time.perf_counter()
    try:
        with path.open("wb") as f:
            for i in range(blocks):
                data = block[i % 7 :] + block[: i % 7]
                written.update(data)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                read.update(chunk)
    finally:
        path.unlink(missing_ok=True)
    mbps = 2 * blocks * len(block) / (time.perf_counter() - started) / 1e6
    same = written.digest() == read.digest()
    ok = same and mbps >= o.min_disk_throughput_mbps
    return _result(
        DISK_THROUGHPUT,
        ok,
        mbps,
        o.min_disk_throughput_mbps,
        "MB/s",
        f"write+fsync+read {mbps:.0f} MB/s" if same else "data read back differs",
    )


def _gemm(o: ValidatorOptions) -> pb.CheckResult:
    import torch

    rng = np.random.default_rng(11)
    n = o.gemm_size
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    got = (torch.from_numpy(a) @ torch.from_numpy(b)).numpy().astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    err = float(np.max(np.abs(got - ref) / np.maximum(scale, 1e-30)))
    tol = 1e-5
    return _result(GEMM, err <= tol, err, tol, "max relative error", f"{n}x{n} float32 matmul vs float64 reference")


def _allreduce(o: ValidatorOptions) -> pb.CheckResult:
    n = max(2, o.num_local_ranks)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [o.python_executable, "-m", "ff_agent.allreduce_check", "--port", str(port), "--local-world-size", str(n)]
    ranks = [
        subprocess.Popen([*argv, "--local-rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for r in range(n)
    ]
    outs = []
    for p in ranks:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in ranks:
                q.kill()
            return _result(ALLREDUCE, False, 0.0, 0.0, "max error", "allreduce did not finish within 120 s")
        if p.returncode != 0:
            return _result(ALLREDUCE, False, 0.0, 0.0, "max error", f"a rank exited {p.returncode}: {err[-300:]!r}")
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    worst = max(x["max_error"] for x in outs)
    ok = all(x["ok"] for x in outs)
    return _result(ALLREDUCE, ok, worst, 0.0, "max error", f"{n} local ranks, hfreduce allreduce of 4 MiB")


async def _storage_reachability(mgmtd: MgmtdClient, timeout_s: float) -> pb.CheckResult:
    try:
        resp = await mgmtd.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
    except Exception as exc:
        return _result(STORAGE_REACHABILITY, False, 0, 1, "storage services", f"mgmtd unreachable: {exc}")
    info = resp.routing_info
    storage = [n for n in info.nodes if n.node_type == common_pb2.NODE_TYPE_STORAGE and n.enabled]
    alive = [n for n in storage if n.status == mgmtd_pb2.NODE_STATUS_ALIVE]
    reachable = 0
    failures = []
    for node in alive:
        address = next((e.address for e in node.endpoints if e.name == "grpc"), "")
        if await _serving(address, timeout_s):
            reachable += 1
        else:
            failures.append(f"node {node.node_id} at {address or '?'} not serving")
    no_replica = [
        c.chain_id
        for c in info.chains
        if not any(t.public_state == mgmtd_pb2.PUBLIC_TARGET_STATE_SERVING for t in c.targets)
    ]
    if no_replica:
        failures.append(f"chains without a serving target: {no_replica[:10]}")
    message = "; ".join(failures) or (
        f"{reachable} storage services serving, {len(info.chains)} chains" if storage else "mgmtd reachable; no storage"
    )
    return _result(STORAGE_REACHABILITY, not failures, float(reachable), float(len(alive)), "storage services", message)


async def _serving(address: str, timeout_s: float) -> bool:
    if not address:
        return False
    channel = open_channel(address)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = await stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)
    except grpc.aio.AioRpcError:
        return False
    finally:
        await channel.close()


LOCAL_CHECKS: dict[str, Callable[[ValidatorOptions], pb.CheckResult]] = {
    CPU_STRESS: _cpu_stress,
    MEMORY_BANDWIDTH: _memory_bandwidth,
    MEMORY_PATTERN: _memory_pattern,
    DISK_THROUGHPUT: _disk_throughput,
    GEMM: _gemm,
    ALLREDUCE: _allreduce,
}


class Validator:
    """Runs the node checks on request or on schedule, never two validations at once."""

    def __init__(self, options: ValidatorOptions, mgmtd: MgmtdClient, timeout_s: float) -> None:
        self.options = options
        self.mgmtd = mgmtd
        self.timeout_s = timeout_s
        self._lock = asyncio.Lock()

    async def run(self, checks: list[str]) -> pb.Validation:
        """Run the named checks (all when empty), one at a time; the blocking ones in a thread.

        A check that raises counts as failed, with the exception as its message.

        Raises:
            InvalidRequest: a name is not one of ``ALL_CHECKS``.
        """
        unknown = sorted(set(checks) - set(ALL_CHECKS))
        if unknown:
            raise InvalidRequest(f"unknown checks {unknown}; known: {list(ALL_CHECKS)}")
        names = [c for c in ALL_CHECKS if not checks or c in checks]
        async with self._lock:
            results = [await self._one(name) for name in names]
        validation = pb.Validation(finished_at=time.time(), passed=all(r.passed for r in results), checks=results)
        logger.info(
            "validation %s",
            "passed" if validation.passed else "FAILED",
            extra={"failed": {r.name: r.message for r in results if not r.passed}},
        )
        return validation

    async def _one(self, name: str) -> pb.CheckResult:
        started = time.perf_counter()
        try:
            if name == STORAGE_REACHABILITY:
                result = await _storage_reachability(self.mgmtd, self.timeout_s)
            else:
                result = await asyncio.to_thread(LOCAL_CHECKS[name], self.options)
        except Exception as exc:  # a check that breaks is a failed check, with why
            logger.exception("validator check %s raised", name)
            result = _result(name, False, 0.0, 0.0, "", f"{type(exc).__name__}: {exc}")
        if name in self.options.forced_failures:
            result.passed = False
            result.message = f"forced to fail by the validator_force_fail test switch ({result.message})"
        result.duration_s = time.perf_counter() - started
        return result
