"""``fireflyer image build`` and ``fireflyer up --containers``: the images build, and a cluster of containers passes the
health checks of the process cluster; the Helm chart under ``podman kube play`` on those images.

Two sizes, by ``FF_CONTAINER_TESTS`` (skipped without it, and where podman, debootstrap or root is missing):

- ``ci`` (``tox -e containers``, part of ``make test``): the base and services images only (no torch); a container
  cluster (its agents in the services image) comes up healthy, a file written through it from this machine is read
  back by the ``hf3fs`` client inside a container, ``down`` leaves nothing; the chart under kube play;
- ``full`` (``tox -e containers-full``): the trainer image too, and the demo's training through its faults on the
  container cluster besides the above.

Images go to a podman storage of the test's own (``CONTAINERS_STORAGE_CONF``), removed in teardown with every
container; only the base root file system's tarball stays cached (``fireflyer image build``'s default cache,
``~/.cache/fireflyer/images``, or ``FF_IMAGE_CACHE_DIR``), so debootstrap runs once per machine.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ff_appliance.cli_image import default_cache_dir
from ff_appliance.health import Health, wait_serving
from ff_appliance.images import ImageNames, project_version
from ff_appliance.state import StateDir, load_plan, read_secret
from ff_appliance.supervisor import pid_alive
from ff_cluster import MgmtdClient
from ff_config.ports import pick_free_ports, port_in_use
from ff_testing.environ import clean_env
from ff_testing.postgres import running_postgres
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (requirements/dev.txt has it)")

# "ci": the services image and the checks of make test; "full": both images and the demo (see the docstring).
MODE = os.environ.get("FF_CONTAINER_TESTS", "")
FULL = MODE == "full"
BUILD_TIMEOUT_S = 900.0  # both images: about 3 min with the base cached, 5 without, on a loaded 2-core machine
UP_TIMEOUT_S = 300.0
DEMO_TIMEOUT_S = 900.0
KUBE_TIMEOUT_S = 300.0
LABEL = "io.fireflyer.cluster"
ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "fireflyer"
# podman kube play sets no ulimits of its own and takes no --runtime: this is what `up --containers` passes as flags.
CONTAINERS_CONF = (
    '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\n'
)
# The chart's services with their gRPC port values and the node id each registers with (kube-play-values.yaml: one
# of each; meta's and the agent's are a hash of a name: only their range is known).
KUBE_SERVICES = {"mgmtd": (100, 101), "storage": (1000, 1001), "meta": (10**6, 2 * 10**6),
                 "scheduler": (200, 201), "telemetry": (300, 301), "agent": (10**9, 2 * 10**9)}  # fmt: skip


def _why_skip() -> str | None:
    if MODE not in ("ci", "full"):
        return (
            "container tests run in `tox -e containers` (FF_CONTAINER_TESTS=ci) and `tox -e containers-full` "
            "(FF_CONTAINER_TESTS=full): they build images (minutes)"
        )
    missing = [tool for tool in ("podman", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} (scripts/bootstrap.sh installs them as root)"
    if os.geteuid() != 0:
        return "needs root (debootstrap, rootful podman)"
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")


@dataclass
class Podman:
    """The test's own podman storage: every podman and fireflyer command here runs with ``env``."""

    env: dict[str, str]

    def run(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def ok(self, *args: str, timeout_s: float = 120.0) -> str:
        proc = self.run(*args, timeout_s=timeout_s)
        assert proc.returncode == 0, f"podman {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def names(self, label: str) -> list[str]:
        return sorted(self.ok("ps", "--all", "--filter", f"label={LABEL}={label}", "--format", "{{.Names}}").split())


def _fireflyer(env: dict[str, str], *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    argv = [str(Path(sys.executable).parent / "fireflyer"), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def _ok(env: dict[str, str], *args: str, timeout_s: float = 120.0) -> str:
    proc = _fireflyer(env, *args, timeout_s=timeout_s)
    assert proc.returncode == 0, f"fireflyer {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    """A podman storage of this module's own, built into once; everything in it is removed afterwards."""
    root = tmp_path_factory.mktemp("podman")
    conf = root / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n')
    podman = Podman(env=clean_env({"CONTAINERS_STORAGE_CONF": str(conf)}))
    try:
        yield podman
    finally:
        podman.run("rm", "--all", "--force", "--time", "5")
        podman.run("rmi", "--all", "--force")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def images(podman: Podman) -> ImageNames:
    """This version's images, built into the module's podman storage: base and services (ci), and trainer (full)."""
    cache = os.environ.get("FF_IMAGE_CACHE_DIR") or str(default_cache_dir(os.environ))
    args = ["image", "build", "--cache-dir", cache] + ([] if FULL else ["--services-only"])
    out = _ok(podman.env, *args, timeout_s=BUILD_TIMEOUT_S)
    names = ImageNames(version=project_version())
    built = f"built {names.services} and {names.trainer}" if FULL else f"built {names.services} (from {names.base});"
    assert built in out, out
    return names


@pytest.mark.timeout(BUILD_TIMEOUT_S + 120)
def test_images_hold_the_services_and_the_trainers_stack(podman: Podman, images: ImageNames) -> None:
    built = (images.base, images.services, images.trainer) if FULL else (images.base, images.services)
    for image in built:
        assert podman.run("image", "exists", image).returncode == 0, image
    if not FULL:  # --services-only: no torch is fetched or installed
        assert podman.run("image", "exists", images.trainer).returncode != 0
    version = '{{index .Labels "org.opencontainers.image.version"}}'
    assert {podman.ok("image", "inspect", "--format", version, i).strip() for i in built[1:]} == {images.version}
    wheels = '{{index .Labels "io.fireflyer.wheels"}}'
    digests = {podman.ok("image", "inspect", "--format", wheels, i).strip() for i in built[1:]}
    assert len(digests) == 1 and len(digests.pop()) == 16  # installed the same wheels, which the label names
    run = ("--runtime", "runc", "run", "--rm", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768")
    code = "import importlib.util as u, ff_mgmtd, ff_appliance, hf3fs.cli; print(u.find_spec('torch') is None)"
    assert podman.ok(*run, images.services, "python", "-c", code).strip() == "True"  # no torch in the services'
    if FULL:
        code = "import torch, haiscale.ddp, hfreduce.distributed; print(torch.__version__)"
        assert podman.ok(*run, images.trainer, "python", "-c", code, timeout_s=300).strip() == "2.13.0+cpu"


def _up_containers(podman: Podman, images: ImageNames, state: Path, *extra: str) -> tuple[str, str]:
    """``up --containers`` of a new cluster in ``state``, checked; returns ``up``'s output and the containers' prefix.

    9 containers of the cluster's label, each in its image (the agents' is the trainer image, or the services image in
    ci), each pid file naming its container's PID 1, ``status`` healthy with every instance SERVING on gRPC health.
    """
    trainer = images.trainer if FULL else images.services
    argv = ["up", "--containers", *([] if FULL else ["--trainer-image", trainer]), *extra]
    up = _ok(podman.env, *argv, "--state-dir", str(state), "--timeout-s", str(UP_TIMEOUT_S),
             timeout_s=UP_TIMEOUT_S + 60)  # fmt: skip
    assert "storage: created 2 chains of 3 (6 targets), all serving" in up
    prefix = _prefix(state)
    instances = [p.name.removesuffix(".pid") for p in sorted((state / "run").glob("*.pid"))]
    assert podman.names(prefix) == sorted(f"{prefix}-{name}" for name in instances)
    assert len(instances) == 9
    image_of = podman.ok("ps", "--filter", f"label={LABEL}={prefix}", "--format", "{{.Names}} {{.Image}}")
    for line in image_of.splitlines():
        name, image = line.split()
        assert image == (trainer if "-agent-" in name else images.services), line
    for name in instances:  # each pid file names its container's PID 1 (podman's init), not the podman client
        pid = int((state / "run" / f"{name}.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0] == b"/run/podman-init", (name, cmdline)
    status = _ok(podman.env, "status", "--state-dir", str(state))
    assert status.rstrip().endswith("healthy") and status.count("SERVING") == 9, status
    return up, prefix


def _down_leaves_nothing(podman: Podman, state: Path, prefix: str, num_instances: int) -> None:
    """``down`` stops every instance; no container of the cluster and none of their PID 1s is left."""
    pids = [int(p.read_text()) for p in (state / "run").glob("*.pid")]
    down = _ok(podman.env, "down", "--state-dir", str(state))
    assert down.count(": stopped (pid") == num_instances, down
    assert podman.names(prefix) == [] and not any(pid_alive(p) for p in pids)


def _teardown_cluster(podman: Podman, state: Path, prefix: str) -> None:
    _fireflyer(podman.env, "down", "--state-dir", str(state), timeout_s=120)
    if prefix:
        left = podman.names(prefix)
        podman.run("rm", "--force", "--time", "1", *left)
        assert left == [], f"containers left after down: {left}"


@pytest.mark.timeout(BUILD_TIMEOUT_S + UP_TIMEOUT_S + 300)
def test_a_container_cluster_serves_files_and_goes_down_clean(
    podman: Podman, images: ImageNames, tmp_path: Path
) -> None:
    """The CI-sized check: health of every container, a file through the cluster, ``down`` leaves nothing."""
    state = tmp_path / "cluster"
    prefix = ""
    try:
        _, prefix = _up_containers(podman, images, state)
        plan, token = load_plan(StateDir(state)), read_secret(StateDir(state).admin_token_file)
        assert plan is not None and token is not None
        mgmtd = ",".join(i.grpc_address for i in plan.of_service("mgmtd"))
        env = {**podman.env, "FF_MGMTD_ADDRESSES": mgmtd, "FF_TOKEN": token}
        local = tmp_path / "hello.bin"
        local.write_bytes(secrets.token_bytes(3 * 2**20 + 17))  # several chunks and a ragged end
        hf3fs = [sys.executable, "-m", "hf3fs"]
        for args in (["mkdir", "-p", "/ci"], ["cp", str(local), "hf3fs:/ci/hello.bin"]):
            wrote = subprocess.run([*hf3fs, *args], env=env, capture_output=True, text=True, timeout=120, check=False)
            assert wrote.returncode == 0, wrote.stderr
        # Read back by the services image's own hf3fs client, in a container on this machine's network.
        read = subprocess.run(
            ["podman", "--runtime", "runc", "run", "--rm", "--network", "host", "--ulimit", "nofile=20000:20000",
             "--ulimit", "nproc=32768:32768", "--env", "FF_MGMTD_ADDRESSES", "--env", "FF_TOKEN", images.services,
             "hf3fs", "cat", "/ci/hello.bin"],
            env=env, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert read.returncode == 0, read.stderr.decode()
        assert read.stdout == local.read_bytes()
        _down_leaves_nothing(podman, state, prefix, num_instances=9)
    finally:
        _teardown_cluster(podman, state, prefix)


@pytest.mark.timeout(BUILD_TIMEOUT_S + 2 * UP_TIMEOUT_S + 2 * DEMO_TIMEOUT_S)
@pytest.mark.skipif(not FULL, reason="the demo's training needs the trainer image: tox -e containers-full")
def test_a_container_cluster_passes_the_health_and_demo_checks(
    podman: Podman, images: ImageNames, tmp_path: Path
) -> None:
    state = tmp_path / "cluster"
    env = podman.env

    def cli(*args: str, timeout_s: float = 120.0) -> str:
        return _ok(env, *args, "--state-dir", str(state), timeout_s=timeout_s)

    prefix = ""
    try:
        up, prefix = _up_containers(podman, images, state)

        tour = cli("demo", "--tour", timeout_s=DEMO_TIMEOUT_S)
        for expected in (
            "acknowledged by every chain's tail",
            "24 reads (8 chunks x 3 replicas) all equal to what was written",
            "WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2",  # the agents' ranks, in the trainer containers
            "succeeded after 2 runs",
            "[24/24] done",
        ):
            assert expected in tour, tour
        # The process cluster's e2e checks (tests/e2e/test_demo_train.py): the training through its preemption and
        # the three faults, whose SIGKILLs and SIGSTOP reach into the containers; the demo fails on any contradiction.
        train = cli("demo", "--train-only", "--faults", "storage,agent,hang", timeout_s=DEMO_TIMEOUT_S)
        for expected in (
            "suspending at step",
            "resumed at",
            "its targets serve again",
            "the scheduler ended run 1 NODE_LOST",
            "hang detected",
            ": succeeded after 4 runs",  # preempted, the agent lost, the hang, the last
            "the cluster keeps running",
        ):
            assert expected in train, train

        # A storage container's PID 1 SIGKILLed: the container is gone; `up` starts it again, healthy.
        storage_pid = int((state / "run" / "storage-1.pid").read_text())
        os.kill(storage_pid, signal.SIGKILL)
        _wait_until(lambda: f"{prefix}-storage-1" not in podman.names(prefix), "storage-1's container removed")
        again = cli("up", "--timeout-s", str(UP_TIMEOUT_S), timeout_s=UP_TIMEOUT_S + 60)
        assert "mgmtd-1: already running" in again and "storage-1: started" in again
        assert cli("status").rstrip().endswith("healthy")

        _down_leaves_nothing(podman, state, prefix, num_instances=10)  # the hang fault's demo asked for a 3rd agent
        # The state is on the state folder's bind mounts: the same cluster comes back.
        cluster_id = up.split("cluster ")[1].split()[0]
        assert f"cluster {cluster_id} is up" in cli("up", "--timeout-s", str(UP_TIMEOUT_S), timeout_s=UP_TIMEOUT_S)
    finally:
        _teardown_cluster(podman, state, prefix)


def _prefix(state: Path) -> str:
    return str(json.loads((state / "plan.json").read_text())["containers"]["prefix"])


def _wait_until(check: object, what: str, timeout_s: float = 60.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not in {timeout_s:g} s: {what}"
        time.sleep(0.5)


def _find_helm() -> str | None:
    for candidate in (os.environ.get("FF_HELM"), str(ROOT / ".tools" / "bin" / "helm"), shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def _kube_ports() -> dict[str, int]:
    """Free ports for every service, the storage data path and the dashboard; each gRPC port + 1000 (its metrics)
    free too."""
    names = [*KUBE_SERVICES, "storageData", "dashboard"]
    while True:
        ports = dict(zip(names, pick_free_ports(len(names), set()), strict=True))
        if not any(port_in_use(ports[n] + 1000) for n in KUBE_SERVICES):
            return ports


@pytest.mark.timeout(BUILD_TIMEOUT_S + KUBE_TIMEOUT_S + 120)
def test_the_chart_runs_under_podman_kube_play(podman: Podman, images: ImageNames, tmp_path: Path) -> None:
    helm = _find_helm()
    if helm is None:
        pytest.skip("helm is not extracted: run `python scripts/get_helm.py`")
    release = f"kp{secrets.token_hex(3)}"
    token_dir, admin_dir = tmp_path / "token", tmp_path / "admin-token"
    token_dir.mkdir()
    admin_dir.mkdir()
    cluster_token = secrets.token_urlsafe(32)
    (token_dir / "token").write_text(cluster_token + "\n")
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    env = {**podman.env, "CONTAINERS_CONF": str(conf)}
    ports = _kube_ports()
    database_secret = f"{release}-db"
    settings = [f"ports.{name}={port}" for name, port in ports.items()] + [
        f"kubePlay.tokenDir={token_dir}",
        f"kubePlay.adminTokenDir={admin_dir}",
        f"image.services.tag={images.version}",
        f"image.trainer.tag={images.version}",
        f"database.external.existingSecret={database_secret}",
    ]
    if not FULL:  # no trainer image: the agent's pod runs in the services image
        settings.append("image.trainer.repository=fireflyer/services")
    helm_env = {**podman.env, **{k: str(tmp_path / "helm" / k) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME",
                                                                        "HELM_DATA_HOME")}}  # fmt: skip
    rendered = subprocess.run(
        [helm, "template", release, str(CHART), "-f", str(CHART / "ci" / "kube-play-values.yaml"),
         *[arg for kv in settings for arg in ("--set", kv)]],
        env=helm_env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    manifest = tmp_path / "kube.yaml"
    manifest.write_text(rendered.stdout)
    # The admin token the chart generated into its Secret, where kubePlay's mgmtd reads it (the kubelet would mount
    # the Secret; podman 4.3 cannot).
    admin_token = _admin_token(rendered.stdout, f"{release}-fireflyer-admin-token")
    (admin_dir / "token").write_text(admin_token)
    with running_postgres() as server:
        url = server.create_database()
        # podman 4.3 does not play the chart's Secrets; a podman secret of the same name stands in (JSON of base64
        # values, as its kube play reads one), so the URL still reaches the pods through secretKeyRef only.
        value = json.dumps({"url": base64.b64encode(url.encode()).decode()})
        made = subprocess.run(["podman", "secret", "create", database_secret, "-"], input=value, env=env,
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert made.returncode == 0, made.stderr
        try:
            played = subprocess.run(["podman", "kube", "play", str(manifest)], env=env, capture_output=True,
                                    text=True, timeout=KUBE_TIMEOUT_S, check=False)  # fmt: skip
            assert played.returncode == 0, played.stdout + played.stderr
            pods = podman.ok("pod", "ps", "--format", "{{.Name}}").split()
            component = f"{release}-fireflyer-"
            assert sorted(p.removeprefix(component) for p in pods if p.startswith(component)) == sorted(
                f"{name}-pod-0" for name in KUBE_SERVICES
            ), pods
            asyncio.run(_check_kube_cluster(ports, cluster_token, admin_token))
        finally:
            subprocess.run(["podman", "kube", "down", str(manifest)], env=env, capture_output=True, timeout=120,
                           check=False)  # fmt: skip
            subprocess.run(["podman", "secret", "rm", database_secret], env=env, capture_output=True, timeout=60,
                           check=False)  # fmt: skip
            # kube play made podman secrets of the chart's Secrets (which its secretKeyRef cannot read): theirs too.
            made_secrets = [
                n for n in podman.ok("secret", "ls", "--format", "{{.Name}}").split() if n.startswith(release)
            ]
            if made_secrets:
                podman.run("secret", "rm", *made_secrets)
            left = podman.ok("pod", "ps", "--format", "{{.Name}}").split()
            assert not [p for p in left if p.startswith(release)], left


async def _check_kube_cluster(ports: dict[str, int], cluster_token: str, admin_token: str) -> None:
    """Every pod's service answers gRPC health SERVING on its port, and registers with mgmtd with its node id; the
    chart's admin token is accepted as an admin's (it makes a user and that user's token)."""
    deadline = time.monotonic() + KUBE_TIMEOUT_S
    for name in KUBE_SERVICES:
        health = await wait_serving(f"127.0.0.1:{ports[name]}", deadline)
        assert health is Health.SERVING, f"{name} on port {ports[name]}: {health}"
    client = MgmtdClient([f"127.0.0.1:{ports['mgmtd']}"], token=cluster_token)
    try:
        while True:
            resp = await client.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
            alive = {n.node_id: n for n in resp.routing_info.nodes if n.status == mgmtd_pb2.NODE_STATUS_ALIVE}
            found = {name: [i for i in alive if low <= i < high] for name, (low, high) in KUBE_SERVICES.items()}
            if all(len(ids) == 1 for ids in found.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await client.close()
    assert all(len(ids) == 1 for ids in found.values()), found
    for name, ids in found.items():  # registered at the address it listens on (the pod's, on the host network)
        assert f"127.0.0.1:{ports[name]}" in str(alive[ids[0]]), (name, alive[ids[0]])
    admin = MgmtdClient([f"127.0.0.1:{ports['mgmtd']}"], token=admin_token)
    try:
        me = (await admin.identity.who_am_i(mgmtd_pb2.WhoAmIRequest())).principal
        assert (me.name, me.role) == ("admin", common_pb2.ROLE_ADMIN), me
        await admin.identity.create_user(mgmtd_pb2.CreateUserRequest(name="kube-play-user"))
        issued = await admin.identity.issue_token(mgmtd_pb2.IssueTokenRequest(user_name="kube-play-user"))
    finally:
        await admin.close()
    user = MgmtdClient([f"127.0.0.1:{ports['mgmtd']}"], token=issued.token)
    try:
        assert (await user.identity.who_am_i(mgmtd_pb2.WhoAmIRequest())).principal.name == "kube-play-user"
    finally:
        await user.close()


def _admin_token(manifest: str, secret_name: str) -> str:
    """The token in the rendered Secret ``secret_name`` (its only key, base64 as Kubernetes keeps it)."""
    docs = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Secret"]
    [secret] = [d for d in docs if d["metadata"]["name"] == secret_name]
    [value] = secret["data"].values()
    return base64.b64decode(value).decode()
