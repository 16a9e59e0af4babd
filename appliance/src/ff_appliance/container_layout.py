"""What ``up`` and ``down`` do about ``--containers``: the container plan, each container's pid, leftovers."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from ff_appliance import containers
from ff_appliance.containers import ContainerPlan, ContainersError
from ff_appliance.images import ImageNames, project_version
from ff_appliance.state import ClusterPlan, StateDir, load_plan
from ff_appliance.supervisor import Started

__all__ = ["ContainerPlan", "ContainersError", "adopt_main_pid", "choose", "clear", "remove_leftovers"]

MAIN_PID_WAIT_S = 30.0  # a ready instance's container runs: its pid shows as soon as podman answers


def example_dirs() -> list[str]:
    """The checkout's ``examples`` folder when there is one: the demo's trainer, which the agents' ranks run."""
    import ff_appliance

    examples = Path(ff_appliance.__file__).resolve().parents[3] / "examples"
    return [str(examples)] if examples.is_dir() else []


def choose(
    state: StateDir,
    asked: bool,
    on_hosts: bool,
    extra_dirs: Sequence[str],
    env: Mapping[str, str],
    trainer_image: str | None = None,
) -> ContainerPlan | None:
    """The container plan this ``up`` runs the cluster with, checked before anything is written or started.

    The plan's (a cluster keeps how it runs), a new one for ``--containers`` on a new cluster, or None (processes).
    ``trainer_image`` (``--trainer-image``): the agents' image of a new cluster instead of this version's trainer
    image (the services image runs agents that start no torch ranks, as the CI container check does).

    Raises:
        ContainersError: ``--containers`` on a cluster of processes, or with ``--hosts``; ``--trainer-image`` without
            ``--containers`` or other than a container cluster's; podman or an image is missing.
    """
    existing = load_plan(state)
    if existing is not None and existing.containers is not None:
        chosen = existing.containers
        if trainer_image is not None and trainer_image != chosen.trainer_image:
            raise ContainersError(
                f"this cluster's agents run in {chosen.trainer_image} (chosen at its first up): --trainer-image is "
                "for a new cluster"
            )
    elif trainer_image is not None and not asked:
        raise ContainersError("--trainer-image goes with --containers")
    elif not asked:
        return None
    elif existing is not None:
        raise ContainersError(
            f"this cluster runs as processes (chosen at its first up): --containers is for a new cluster (start a "
            f"new state folder, not {state.root})"
        )
    elif on_hosts:
        raise ContainersError(
            "--containers and --hosts do not go together: the containers share this machine's network"
        )
    else:
        shared = [str(state.root), *example_dirs(), *extra_dirs]
        chosen = containers.new_container_plan(
            ImageNames(version=project_version()), shared, trainer_image=trainer_image
        )
    containers.check_can_run(chosen, env)
    return chosen


def clear(plan: ClusterPlan, names: Sequence[str], env: Mapping[str, str]) -> None:
    """Remove the stopped containers of the instances ``names`` before they start again (no-op for processes)."""
    if plan.containers is not None:
        containers.remove_named([plan.containers.container_name(n) for n in names], env)


def adopt_main_pid(plan: ClusterPlan, launched: Started, pid_file: Path, env: Mapping[str, str]) -> None:
    """A ready instance's container: its pid file (and ``launched.pid``) name the container's PID 1 from now on.

    Raises:
        ContainersError: the container does not run (its podman client is left to report why).
    """
    if plan.containers is None:
        return
    name = plan.containers.container_name(launched.name)
    pid = containers.wait_main_pid(name, env, time.monotonic() + MAIN_PID_WAIT_S)
    if pid is None:
        raise ContainersError(f"{launched.name}: container {name} wrote its ready file but does not run")
    launched.main_pid = pid
    pid_file.write_text(f"{pid}\n")


def remove_leftovers(plan: ClusterPlan, env: Mapping[str, str] | None, out: TextIO) -> None:
    """After ``down`` stopped every instance: remove the cluster's containers still there (none, normally)."""
    if plan.containers is None:
        return
    left = containers.remove_containers(plan.containers, env)
    if left:
        print(f"containers: removed {len(left)} left behind ({', '.join(left)})", file=out)
