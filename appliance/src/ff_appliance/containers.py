"""``up --containers``: each service instance in its own podman container, run from the images ``image build`` makes.

How an instance runs (``run_argv``): ``podman run --rm`` attached (not ``-d``), started detached by the supervisor as
any instance is, so its log file, its ready file and ``up``'s early-exit check work as for a process:

- ``--network host``: every service listens on the loopback ports of the plan, as the process cluster does, so
  clients, health checks and ``status`` are the same; nothing is published anywhere else;
- the cluster's state folder (and the other ``shared_dirs``, such as the demo's example) is bind-mounted at the same
  path: every path on the command line means the same inside, and the data stays on this machine's disk;
- ``--init`` (catatonit as PID 1 forwards SIGTERM to the service: a Python PID 1 would ignore it), ``runc`` (crun
  fails on this machine's hybrid cgroups) and ulimits under the hard limits a rootful container may set;
- the agents run in the trainer image (their ranks are their children: torch, haiscale, hfreduce) with a larger
  ``/dev/shm`` for hfreduce's shared memory.

Once an instance is ready its pid file names the container's PID 1 as this machine sees it (``main_pid``), so
``down``'s SIGTERM, its SIGKILL after the timeout, ``status``, and the demo's SIGKILL faults act on the container,
not on the podman client attached to it. Containers are named ``<prefix>-<instance>`` and labelled with the prefix:
``down`` removes whatever of them is left (a client killed before its container stopped).
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ff_appliance.images import ImageNames

LABEL = "io.fireflyer.cluster"
ULIMITS = ("nofile=20000:20000", "nproc=32768:32768")  # under this machine's hard limits (nofile 20000)
AGENT_SHM_SIZE = "1g"
TRAINER_SERVICES = frozenset({"agent"})  # run in the trainer image
PODMAN_TIMEOUT_S = 60.0
MAIN_PID_POLL_S = 0.2
_PREFIX = re.compile(r"^ff-[0-9a-f]{6}$")


class ContainersError(Exception):
    """The cluster's containers cannot be run or removed as asked."""


@dataclass(frozen=True, kw_only=True)
class ContainerPlan:
    """How the cluster's instances run in containers, kept in the plan so every ``up`` runs the same images."""

    prefix: str  # ff-<6 hex>: container names and the label
    services_image: str
    trainer_image: str
    shared_dirs: tuple[str, ...]  # bind-mounted at the same path into every container

    def container_name(self, instance: str) -> str:
        """The container of ``instance``."""
        return f"{self.prefix}-{instance}"

    def image_of(self, service: str) -> str:
        """The image ``service`` runs in."""
        return self.trainer_image if service in TRAINER_SERVICES else self.services_image

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data for plan.json (``from_dict`` reads it back)."""
        return {
            "prefix": self.prefix,
            "services_image": self.services_image,
            "trainer_image": self.trainer_image,
            "shared_dirs": list(self.shared_dirs),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ContainerPlan:
        """Raises: KeyError, TypeError, ValueError: not a container plan."""
        prefix = str(doc["prefix"])
        if not _PREFIX.match(prefix):  # names go to `podman rm --force`
            raise ValueError(f"not containers made by fireflyer: prefix {prefix!r}")
        return cls(
            prefix=prefix,
            services_image=str(doc["services_image"]),
            trainer_image=str(doc["trainer_image"]),
            shared_dirs=tuple(str(d) for d in doc["shared_dirs"]),
        )


def new_container_plan(
    images: ImageNames, shared_dirs: Iterable[str], short_id: str | None = None, trainer_image: str | None = None
) -> ContainerPlan:
    """A new cluster's container plan: a fresh prefix, the images of ``images``' version.

    ``trainer_image``, when given, is the agents' image instead of the version's trainer image.
    """
    return ContainerPlan(
        prefix=f"ff-{short_id or secrets.token_hex(3)}",
        services_image=images.services,
        trainer_image=trainer_image or images.trainer,
        shared_dirs=tuple(dict.fromkeys(shared_dirs)),
    )


def run_argv(
    plan: ContainerPlan, *, instance: str, service: str, argv: Sequence[str], env_names: Sequence[str] = ()
) -> list[str]:
    """``podman run`` of one instance: ``argv`` inside its container (attached: the caller's output is its log).

    ``env_names`` pass from podman's own environment by name, so their values (a database password) are on no
    command line.
    """
    cmd = ["podman", "--runtime", "runc", "run", "--rm", "--name", plan.container_name(instance)]
    cmd += ["--label", f"{LABEL}={plan.prefix}", "--network", "host", "--init"]
    for limit in ULIMITS:
        cmd += ["--ulimit", limit]
    if service in TRAINER_SERVICES:
        cmd += ["--shm-size", AGENT_SHM_SIZE]
    for folder in plan.shared_dirs:
        cmd += ["--volume", f"{folder}:{folder}"]
    for name in env_names:
        cmd += ["--env", name]
    return [*cmd, plan.image_of(service), *argv]


def remove_argv(names: Sequence[str]) -> list[str]:
    """Stop (SIGKILL after podman's grace) and remove these containers; missing ones are no error."""
    return ["podman", "rm", "--force", "--ignore", "--time", "5", *names]


def list_argv(prefix: str) -> list[str]:
    """The names of every container of the cluster labelled ``prefix``, running or not."""
    return ["podman", "ps", "--all", "--filter", f"label={LABEL}={prefix}", "--format", "{{.Names}}"]


def main_pid_argv(name: str) -> list[str]:
    """The pid, as this machine sees it, of the container's PID 1 (0 while it is not running)."""
    return ["podman", "container", "inspect", "--format", "{{.State.Pid}}", name]


def check_can_run(plan: ContainerPlan, env: Mapping[str, str] | None) -> None:
    """Check that podman is installed and both images are in its storage.

    Raises:
        ContainersError: podman is missing, or an image is (``fireflyer image build`` makes them).
    """
    if shutil.which("podman") is None:
        raise ContainersError("--containers needs podman (apt package podman; scripts/bootstrap.sh installs it)")
    for image in dict.fromkeys((plan.services_image, plan.trainer_image)):
        if _podman(["podman", "image", "exists", image], env, check=False).returncode != 0:
            raise ContainersError(f"image {image} is not in podman's storage: run `fireflyer image build` first")


def remove_containers(plan: ContainerPlan, env: Mapping[str, str] | None) -> list[str]:
    """Remove every container of the cluster left over (a client stopped before its container); their names."""
    names = [n for n in _podman(list_argv(plan.prefix), env).stdout.split() if n]
    if names:
        _podman(remove_argv(names), env)
    return names


def remove_named(names: Sequence[str], env: Mapping[str, str] | None) -> None:
    """Before starting instances: a stopped container of the same name would refuse the new one."""
    if names:
        _podman(remove_argv(names), env)


def wait_main_pid(name: str, env: Mapping[str, str] | None, deadline: float) -> int | None:
    """The container's PID 1 on this machine once it runs; None if it does not before the monotonic ``deadline``."""
    while True:
        proc = _podman(main_pid_argv(name), env, check=False)
        pid = int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip().isdigit() else 0
        if pid > 0:
            return pid
        if time.monotonic() >= deadline:
            return None
        time.sleep(MAIN_PID_POLL_S)


def _podman(argv: list[str], env: Mapping[str, str] | None, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a podman command (``env`` None: this process's environment)."""
    try:
        proc = subprocess.run(
            argv,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            check=False,
            timeout=PODMAN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ContainersError(f"`{' '.join(argv[:4])} ...` did not finish in {PODMAN_TIMEOUT_S:g} s") from None
    if check and proc.returncode != 0:
        raise ContainersError(f"`{' '.join(argv[:4])} ...` exited with {proc.returncode}: {proc.stderr.strip()}")
    return proc
