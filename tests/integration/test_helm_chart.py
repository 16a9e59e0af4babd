"""The Helm chart (deploy/helm/fireflyer) rendered by the real helm CLI: facts of the manifests it makes.

helm comes from ``python scripts/get_helm.py`` (into .tools/bin; ``tox -e helm`` does it), or $FF_HELM, or PATH;
without it these tests skip. Validation against Kubernetes' schemas is ``tox -e helm``'s (kubernetes-validate).
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ff_cluster import MgmtdClient
from ff_testing.environ import clean_env
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (requirements/dev.txt has it)")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "fireflyer"
HA_VALUES = CHART / "ci" / "ha-external-values.yaml"
EXTERNAL_PASSWORD = "s3cret-Passw0rd"  # the password in HA_VALUES' database URL
SERVICES = ("mgmtd", "meta", "storage", "scheduler", "telemetry", "agent")
DATABASE_SERVICES = ("mgmtd", "meta", "scheduler", "telemetry")
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")

Doc = dict[str, Any]


def find_helm() -> str | None:
    for candidate in (os.environ.get("FF_HELM"), str(ROOT / ".tools" / "bin" / "helm"), shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


HELM = find_helm()
pytestmark = pytest.mark.skipif(HELM is None, reason="helm is not extracted: run `python scripts/get_helm.py`")


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    home = tmp_path_factory.mktemp("helm-home")
    yield {**os.environ, **{f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}}


def helm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], env=env, text=True, capture_output=True, check=False, timeout=60)


def render(env: dict[str, str], *args: str) -> list[Doc]:
    done = helm(env, "template", "ff", str(CHART), "-n", "fireflyer", *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def default(helm_home: dict[str, str]) -> list[Doc]:
    return render(helm_home)


@pytest.fixture(scope="module")
def ha(helm_home: dict[str, str]) -> list[Doc]:
    return render(helm_home, "-f", str(HA_VALUES))


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def component(doc: Doc) -> str:
    return str(doc["metadata"]["labels"]["app.kubernetes.io/component"])


def pod_specs(docs: list[Doc]) -> Iterator[tuple[str, Doc]]:
    for d in docs:
        if d["kind"] in WORKLOADS:
            yield f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"]


def service_container(doc: Doc) -> Doc:
    containers: list[Doc] = doc["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def flag(container: Doc, name: str) -> str:
    values: list[str] = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name}: {values}"
    return values[0]


def secret_values(docs: list[Doc]) -> list[str]:
    """Every value the release's Secrets hold (decoded)."""
    values = []
    for d in docs:
        if d["kind"] == "Secret":
            values += [base64.b64decode(v).decode() for v in (d.get("data") or {}).values()]
            values += list((d.get("stringData") or {}).values())
    return values


@pytest.mark.parametrize("which", ["default", "ha"])
def test_every_service_has_grpc_probes_on_its_port(which: str, request: pytest.FixtureRequest) -> None:
    docs: list[Doc] = request.getfixturevalue(which)
    seen = set()
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet", "DaemonSet") or component(d) not in SERVICES:
            continue
        seen.add(component(d))
        c = service_container(d)
        port = int(flag(c, "listen-address").rsplit(":", 1)[1])
        grpc_ports = [p["containerPort"] for p in c["ports"] if p["name"] == "grpc"]
        assert grpc_ports == [port], d["metadata"]["name"]
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert c[probe]["grpc"] == {"port": port}, f"{d['metadata']['name']} {probe}"
        # the address others are given is the pod's, on the same port
        assert flag(c, "advertise-address") == f"$(POD_IP):{port}"
    assert seen == set(SERVICES)


def test_storage_is_a_statefulset_with_volume_claims(default: list[Doc]) -> None:
    sts = one(default, "StatefulSet", "ff-fireflyer-storage")
    claims = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    assert claims["data"]["spec"]["resources"]["requests"]["storage"] == "100Gi"
    c = service_container(sts)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert flag(c, "state-dir") == mounts["data"]
    # its targets belong to its node id: stable, from the pod's ordinal
    assert "--node-id=" in " ".join(c["command"]) and "POD_NAME##*-" in " ".join(c["command"])
    assert flag(c, "data-listen-address") == "$(POD_IP):8102"


def test_secrets_reach_pods_by_reference_only(default: list[Doc], ha: list[Doc]) -> None:
    for docs in (default, ha):
        secrets = [s for s in secret_values(docs) if len(s) >= 8]
        assert secrets, "the release makes its Secrets"
        for where, spec in pod_specs(docs):
            text = yaml.safe_dump(spec)
            assert not [s for s in secrets if s in text], f"{where} holds a secret's value"
            for c in spec.get("initContainers", []) + spec["containers"]:
                for e in c.get("env", []):
                    if re.search("TOKEN|PASSWORD|DATABASE_URL", e["name"]) and not e["name"].endswith("_FILE"):
                        assert "secretKeyRef" in e.get("valueFrom", {}) or e.get("value", "").startswith(
                            "$(DATABASE_URL)"
                        ), f"{where} {c['name']} {e['name']}"
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            if "cluster-token" in volumes:
                assert volumes["cluster-token"]["secret"]["secretName"] == "ff-fireflyer-cluster-token"


def test_the_database_url_with_its_password_goes_through_a_secret(ha: list[Doc]) -> None:
    secret = one(ha, "Secret", "ff-fireflyer-database")
    assert EXTERNAL_PASSWORD in secret["stringData"]["url"]
    outside = [d for d in ha if d["kind"] != "Secret" and EXTERNAL_PASSWORD in yaml.safe_dump(d)]
    assert not outside, [d["metadata"]["name"] for d in outside]
    assert not [d for d in ha if d["kind"] == "StatefulSet" and component(d) == "postgresql"]
    for service in DATABASE_SERVICES:
        workload = next(d for d in ha if d["kind"] in ("Deployment", "StatefulSet") and component(d) == service)
        env = {e["name"]: e for e in service_container(workload)["env"]}
        ref = env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "ff-fireflyer-database", "key": "url"}
        # the service's own schema first on the search path, as `fireflyer up --database` does
        assert env[f"FF_{service.upper()}_DATABASE_URL"]["value"] == (
            f"$(DATABASE_URL)?options=-csearch_path%3Dfireflyer_{service}"
        )
        assert env["PGSSLMODE"]["value"] == "require"
        init = {c["name"]: c for c in workload["spec"]["template"]["spec"]["initContainers"]}
        assert f'CREATE SCHEMA IF NOT EXISTS "fireflyer_{service}"' in init["schema"]["command"][-1]


def test_bundled_postgresql_by_default(default: list[Doc]) -> None:
    sts = one(default, "StatefulSet", "ff-fireflyer-postgresql")
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    url = one(default, "Secret", "ff-fireflyer-database")["stringData"]["url"]
    assert re.fullmatch(
        r"postgresql\+psycopg://fireflyer:[A-Za-z0-9]{32}@ff-fireflyer-postgresql\.fireflyer\.svc\.cluster\.local:5432/fireflyer",
        url,
    )


def test_replicas_follow_values(default: list[Doc], ha: list[Doc], helm_home: dict[str, str]) -> None:
    def counts(docs: list[Doc]) -> tuple[int, int, int]:
        return (
            one(docs, "StatefulSet", "ff-fireflyer-mgmtd")["spec"]["replicas"],
            one(docs, "StatefulSet", "ff-fireflyer-storage")["spec"]["replicas"],
            one(docs, "Deployment", "ff-fireflyer-meta")["spec"]["replicas"],
        )

    assert counts(default) == (3, 3, 2)
    assert counts(ha) == (3, 6, 3)
    five = render(helm_home, "--set", "mgmtd.replicas=5,storage.replicas=4,meta.replicas=1")
    assert counts(five) == (5, 4, 1)
    # every client is given every mgmtd instance; the setup job waits for every storage pod
    addresses = flag(service_container(one(five, "Deployment", "ff-fireflyer-meta")), "mgmtd-addresses").split(",")
    assert addresses == [
        f"ff-fireflyer-mgmtd-{i}.ff-fireflyer-mgmtd-headless.fireflyer.svc.cluster.local:8000" for i in range(5)
    ]
    setup_env = {e["name"]: e.get("value") for e in service_container(one(five, "Job", "ff-fireflyer-setup"))["env"]}
    assert setup_env["FF_SETUP_STORAGE_NODES"] == "4"
    # one meta instance: no PodDisruptionBudget that would block every drain
    assert {d["metadata"]["name"] for d in five if d["kind"] == "PodDisruptionBudget"} == {
        "ff-fireflyer-mgmtd",
        "ff-fireflyer-storage",
    }


def test_no_service_link_variables(default: list[Doc]) -> None:
    # A Service named ff-mgmtd would give every pod FF_MGMTD_SERVICE_HOST, which mgmtd refuses as an unknown setting.
    for where, spec in pod_specs(default):
        assert spec["enableServiceLinks"] is False, where


def test_agents_on_labelled_gpu_nodes(default: list[Doc], ha: list[Doc], helm_home: dict[str, str]) -> None:
    for docs, host_network in ((default, False), (ha, True)):
        ds = one(docs, "DaemonSet", "ff-fireflyer-agent")
        spec = ds["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"fireflyer.io/agent": "true"}
        c = service_container(ds)
        assert c["image"] == "fireflyer/trainer:0.1.0"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert spec.get("hostNetwork", False) is host_network
        assert flag(c, "master-ip") == "$(POD_IP)"
    cpu = render(helm_home, "--set", "agent.gpu.count=0")
    assert "nvidia.com/gpu" not in service_container(one(cpu, "DaemonSet", "ff-fireflyer-agent"))["resources"].get(
        "limits", {}
    )


def test_service_monitor_is_off_by_default(default: list[Doc], ha: list[Doc]) -> None:
    assert not [d for d in default if d["kind"] == "ServiceMonitor"]
    monitor = one(ha, "ServiceMonitor", "ff-fireflyer")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "mgmtd.replicas=0"], "/mgmtd/replicas"),
        (["--set", "database.mode=external"], "needs database.external.url or database.external.existingSecret"),
        (["--set", "database.external.url=postgresql://u:p@h/db"], "/database/external/url"),
        (["--set", "storage.replicas=2"], "storage.replicas (2) must be at least storage.chains.replication (3)"),
        (["--set", "mgmtd.replica=2"], "additional properties 'replica' not allowed"),
    ],
)
def test_bad_values_are_refused(values: list[str], message: str, helm_home: dict[str, str]) -> None:
    done = helm(helm_home, "template", "ff", str(CHART), *values)
    assert done.returncode != 0
    assert message in done.stderr


def test_schema_init_and_service_urls_on_a_real_postgresql(
    postgres_url: str, helm_home: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pods do with the database values, run here: the init container's script makes each service's
    schema, and the URL Kubernetes composes from the Secret's ($(DATABASE_URL)...) puts the service in it."""
    import sqlalchemy as sa

    docs = render(helm_home, "--set", f"database.mode=external,database.external.url={postgres_url}")
    url = one(docs, "Secret", "ff-fireflyer-database")["stringData"]["url"]
    assert url == postgres_url
    for service in DATABASE_SERVICES:
        workload = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet") and component(d) == service)
        init = workload["spec"]["template"]["spec"]["initContainers"][0]
        monkeypatch.setenv("DATABASE_URL", url)
        for _ in range(
            2
        ):  # again: the schema is there. Run here (not `python -c`: 8 interpreters importing SQLAlchemy)
            exec(compile(init["command"][-1], f"{service}-schema-init", "exec"), {"__name__": "__main__"})
        env = {e["name"]: e for e in service_container(workload)["env"]}
        composed = env[f"FF_{service.upper()}_DATABASE_URL"]["value"].replace("$(DATABASE_URL)", url)
        engine = sa.create_engine(composed)
        try:
            with engine.begin() as conn:
                assert conn.execute(sa.text("SELECT current_schema()")).scalar() == f"fireflyer_{service}"
        finally:
            engine.dispose()


# ---- the rendered pods' command lines, run as processes (no images or Kubernetes here) ----


@dataclass(frozen=True)
class Pod:
    name: str
    probe_address: str
    proc: subprocess.Popen[bytes]


LOCAL_IPS = {"mgmtd": 10, "meta": 20, "scheduler": 30, "telemetry": 40, "agent": 50, "storage": 60}


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of command, args and env values: $(VAR) from the container's env, $$ is $."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i)) != -1 and text[i + 2 : end] in env:
            out.append(env[text[i + 2 : end]])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def container_env(container: Doc, pod: dict[str, str], secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "valueFrom" not in e:
            env[e["name"]] = k8s_expand(e["value"], env)
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = pod[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = secrets[(ref["name"], ref["key"])]
    return env


def pod_argv(container: Doc, env: dict[str, str], root: Path) -> list[str]:
    """The container's argv as the kubelet makes it, with this machine's stand-ins: one loopback address per pod
    instead of its network namespace (so 0.0.0.0 becomes the pod's address), folders under ``root``."""
    argv = [k8s_expand(a, env) for a in container["command"] + container.get("args", [])]
    argv = [a.replace("0.0.0.0:", f"{env['POD_IP']}:").replace("/var/", f"{root}/var/") for a in argv]
    return argv


def start_pods(docs: list[Doc], root: Path, mgmtd_address: str, monkeypatch: pytest.MonkeyPatch) -> list[Pod]:
    """Every service pod of ``docs`` as a process (after its init container's script, run here)."""
    secrets = {(d["metadata"]["name"], "url"): d["stringData"]["url"] for d in docs if "url" in d.get("stringData", {})}
    pods: list[Pod] = []
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet", "DaemonSet") or component(d) not in SERVICES:
            continue
        name = component(d)
        for ordinal in range(d["spec"].get("replicas", 1)):
            pod_name = f"{d['metadata']['name']}-{ordinal}"
            ip = f"127.0.0.{LOCAL_IPS[name] + ordinal}"
            fields = {"metadata.name": pod_name, "status.podIP": ip, "spec.nodeName": f"node-{name}-{ordinal}"}
            for init in d["spec"]["template"]["spec"].get("initContainers", []):
                monkeypatch.setenv("DATABASE_URL", container_env(init, fields, secrets)["DATABASE_URL"])
                exec(compile(init["command"][-1], f"{name}-schema-init", "exec"), {"__name__": "__main__"})
            c = service_container(d)
            env = container_env(c, fields, secrets)
            argv = [a for a in pod_argv(c, env, root) if not a.startswith("--mgmtd-addresses=")]
            if name != "mgmtd":
                argv.append(f"--mgmtd-addresses={mgmtd_address}")
            base = clean_env()
            with (root / f"{pod_name}.log").open("wb") as log:
                proc = subprocess.Popen(argv, env={**base, **env}, stdout=log, stderr=subprocess.STDOUT)
            pods.append(Pod(pod_name, f"{ip}:{c['readinessProbe']['grpc']['port']}", proc))
    return pods


async def wait_serving(pod: Pod, pods: list[Pod], root: Path) -> None:
    """Until the pod answers its readiness probe's call (grpc.health.v1 Check of "") with SERVING."""
    async with grpc.aio.insecure_channel(pod.probe_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(300):
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            assert all(p.proc.poll() is None for p in pods), logs(root)
            await asyncio.sleep(0.3)
    raise TimeoutError(f"{pod.name} not serving: {logs(root)}")


def run_setup_job(docs: list[Doc], root: Path, mgmtd_address: str, token_file: Path) -> str:
    """The setup Job's script from its ConfigMap, with the Job's environment (mgmtd and the token file here)."""
    script = root / "setup_chains.py"
    script.write_text(one(docs, "ConfigMap", "ff-fireflyer-setup")["data"]["setup_chains.py"])
    env = {e["name"]: e["value"] for e in service_container(one(docs, "Job", "ff-fireflyer-setup"))["env"]}
    env |= {"FF_SETUP_MGMTD_ADDRESSES": mgmtd_address, "FF_SETUP_TIMEOUT_S": "60",
            "FF_SETUP_CLUSTER_TOKEN_FILE": str(token_file)}  # fmt: skip
    done = subprocess.run([sys.executable, str(script)], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=90, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr + logs(root)
    return done.stdout


def stop_pods(pods: list[Pod]) -> None:
    for p in pods:
        p.proc.terminate()
    for p in pods:
        try:
            p.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()


def logs(folder: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(folder.glob("*.log")))


@pytest.mark.timeout(180)
async def test_rendered_pods_run_as_a_cluster(
    postgres_url: str, helm_home: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every service pod's command line, env and probes from the chart, run as processes: each serves gRPC health
    on its probe's port, every pod registers under the node id its command line chose, and the setup job's script
    makes the chain table (once)."""
    docs = render(helm_home, "--set", ",".join([
        "database.mode=external", f"database.external.url={postgres_url}", "mgmtd.replicas=1", "meta.replicas=1",
        "agent.gpu.count=0", "agent.ranksRunAs=agent-user", f"image.python={sys.executable}",
    ]))  # fmt: skip
    token_file = tmp_path / "var" / "run" / "fireflyer" / "cluster-token" / "token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text("chart-test-cluster-token")
    mgmtd_address = f"127.0.0.{LOCAL_IPS['mgmtd']}:8000"
    pods = await asyncio.to_thread(start_pods, docs, tmp_path, mgmtd_address, monkeypatch)
    try:
        assert len(pods) == 8  # mgmtd, meta, 3 storage, scheduler, telemetry, an agent
        await asyncio.gather(*(wait_serving(p, pods, tmp_path) for p in pods))
        first = await asyncio.to_thread(run_setup_job, docs, tmp_path, mgmtd_address, token_file)
        assert "made chain table 1 with 2 chains over 3 storage nodes" in first
        again = await asyncio.to_thread(run_setup_job, docs, tmp_path, mgmtd_address, token_file)
        assert "nothing to do" in again
        client = MgmtdClient([mgmtd_address], token="chart-test-cluster-token")
        try:
            info = (await client.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
        finally:
            await client.close()
        storage_ids = sorted(n.node_id for n in info.nodes if n.node_type == common_pb2.NODE_TYPE_STORAGE)
        assert storage_ids == [1000, 1001, 1002]
        # every pod chose its id (mgmtd's own assignment, the largest + 1, could take a storage pod's id)
        ids = {common_pb2.NodeType.Name(n.node_type).removeprefix("NODE_TYPE_"): n.node_id for n in info.nodes}
        assert (ids["MGMTD"], ids["SCHEDULER"], ids["TELEMETRY"]) == (100, 200, 300)
        assert 1_000_000 <= ids["META"] < 2_000_000
        assert 1_000_000_000 <= ids["AGENT"] < 2_000_000_000
    finally:
        await asyncio.to_thread(stop_pods, pods)
