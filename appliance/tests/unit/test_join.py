"""``join`` and ``leave`` refusals that come before any call, and the device count without NVML."""

from __future__ import annotations

import ctypes
import io
import json
from pathlib import Path

import pytest

from ff_appliance import join
from ff_appliance.join import JoinError, JoinOptions, find_devices
from ff_appliance.lifecycle import ApplianceError, UpOptions, up
from ff_appliance.state import ClusterPlan, InstancePlan, StateDir, save_plan


def _options(**changes: object) -> JoinOptions:
    values: dict[str, object] = {
        "mgmtd": ("10.1.2.1:5000",),
        "token": "t",
        "agent": True,
        "storage_disks": (),
        "env": {},
    }
    values.update(changes)
    return JoinOptions(**values)  # type: ignore[arg-type]


def _plan() -> ClusterPlan:
    return ClusterPlan(
        instances=(InstancePlan(name="mgmtd-1", service="mgmtd", node_id=1, grpc_port=1, metrics_port=2),)
    )


async def test_join_needs_a_role(tmp_path: Path) -> None:
    with pytest.raises(JoinError, match="--agent, --storage PATH, or both"):
        await join.join(StateDir(tmp_path / "s"), _options(agent=False), io.StringIO())
    assert not (tmp_path / "s").exists()


async def test_join_refuses_the_state_folder_of_a_cluster_brought_up_here(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    save_plan(state, _plan())
    with pytest.raises(JoinError, match="holds a cluster brought up here"):
        await join.join(state, _options(), io.StringIO())
    assert not join.joined_file(state).exists()


async def test_up_refuses_a_joined_state_folder_and_leave_one_that_has_not_joined(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    with pytest.raises(JoinError, match="has not joined a cluster"):
        await join.leave(state, 1.0, io.StringIO())
    join.joined_file(state).write_text('{"mgmtd": ["10.1.2.1:5000"], "storage_disks": []}\n')
    with pytest.raises(ApplianceError, match="joined to a cluster run elsewhere"):
        await up(state, UpOptions(env={}), io.StringIO())
    assert not state.plan_file.exists()


def test_without_nvml_the_agent_offers_cpu_slots_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library(name: str) -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(join.ctypes, "CDLL", no_library)
    devices = find_devices()
    assert (devices.num_gpus, devices.num_slots) == (0, join.CPU_DEVICE_SLOTS)
    assert devices.how.startswith("no GPU (no NVIDIA driver")


async def test_a_second_join_keeps_the_storage_disks_of_the_first(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    first = (tmp_path / "disk-a",)
    assert join._storage_disks(state, first) == first  # the first join: as given
    join.joined_file(state).write_text(json.dumps({"mgmtd": ["10.1.2.1:5000"], "storage_disks": [str(first[0])]}))
    assert join._storage_disks(state, ()) == first  # `join --agent` again restarts the storage on its disks
    assert join._storage_disks(state, first) == first
    with pytest.raises(JoinError, match="keeps its targets in"):
        join._storage_disks(state, (tmp_path / "disk-b",))
    with pytest.raises(JoinError, match="keeps its targets in"):
        await join.join(state, _options(storage_disks=(tmp_path / "disk-b",)), io.StringIO())
