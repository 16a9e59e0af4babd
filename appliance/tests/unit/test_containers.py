"""Container clusters and image builds: the container specs and command lines, and the plan that keeps them."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from ff_appliance import container_layout
from ff_appliance.cli import build_parser
from ff_appliance.cli_image import default_cache_dir
from ff_appliance.containers import ContainerPlan, ContainersError, new_container_plan, remove_argv, run_argv
from ff_appliance.images import (
    SERVICES_PACKAGES,
    SERVICES_WHEEL_SOURCES,
    TRAINER_PACKAGES,
    WHEEL_SOURCES,
    ImageNames,
    base_key,
    build_argv,
    debootstrap_argv,
    import_argv,
    project_version,
    tar_argv,
    wheel_argv,
    wheels_digest,
)
from ff_appliance.services import LaunchContext, command, spec_for
from ff_appliance.state import ClusterPlan, InstancePlan, PlanError, StateDir, extend_plan, save_plan

IMAGES = ImageNames(version="9.8.7")


def _containers(shared: tuple[str, ...] = ("/state",)) -> ContainerPlan:
    return new_container_plan(IMAGES, shared, short_id="0a1b2c")


def _plan(containers: ContainerPlan | None) -> ClusterPlan:
    return ClusterPlan(
        instances=(
            InstancePlan(name="mgmtd-1", service="mgmtd", node_id=1, grpc_port=7001, metrics_port=7002),
            InstancePlan(name="agent-1", service="agent", node_id=2, grpc_port=7003, metrics_port=7004),
        ),
        containers=containers,
    )


def _options(argv: list[str], flag: str) -> list[str]:
    """Every value of a repeated ``flag`` in ``argv``."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_image_names_follow_the_version_under_localhost() -> None:
    assert IMAGES.base == "localhost/fireflyer/base:9.8.7"
    assert IMAGES.services == "localhost/fireflyer/services:9.8.7"
    assert IMAGES.trainer == "localhost/fireflyer/trainer:9.8.7"


def test_a_service_runs_in_the_services_image_the_agent_in_the_trainer_image() -> None:
    plan = _containers(("/state", "/checkout/examples"))
    argv = run_argv(plan, instance="mgmtd-1", service="mgmtd", argv=["python", "-m", "ff_mgmtd", "--node-id", "1"])
    assert argv[:4] == ["podman", "--runtime", "runc", "run"]  # crun fails on this machine's hybrid cgroups
    assert argv[-6:] == [IMAGES.services, "python", "-m", "ff_mgmtd", "--node-id", "1"]
    assert _options(argv, "--name") == ["ff-0a1b2c-mgmtd-1"]
    assert _options(argv, "--label") == ["io.fireflyer.cluster=ff-0a1b2c"]
    assert _options(argv, "--network") == ["host"]
    assert "--rm" in argv and "--init" in argv  # removed when it stops; SIGTERM reaches the service
    assert _options(argv, "--ulimit") == ["nofile=20000:20000", "nproc=32768:32768"]
    assert _options(argv, "--volume") == ["/state:/state", "/checkout/examples:/checkout/examples"]
    assert "--shm-size" not in argv
    agent = run_argv(plan, instance="agent-1", service="agent", argv=["python", "-m", "ff_agent"])
    assert agent[-4] == IMAGES.trainer
    assert _options(agent, "--shm-size") == ["1g"]  # hfreduce's shared memory between the ranks


def test_a_database_url_passes_by_name_never_by_value() -> None:
    argv = run_argv(_containers(), instance="meta-1", service="meta", argv=["python"], env_names=["FF_META_URL"])
    assert _options(argv, "--env") == ["FF_META_URL"]


def test_command_of_a_container_cluster_wraps_the_same_flags_in_podman_run(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    processes = LaunchContext(state=state, plan=_plan(None))
    in_containers = LaunchContext(state=state, plan=_plan(_containers((str(tmp_path),))), database_urls={"mgmtd": "x"})
    for name in ("mgmtd-1", "agent-1"):
        instance = processes.plan.find(name)
        spec = spec_for(instance)
        plain = command(spec, processes, instance)
        wrapped = command(spec, in_containers, instance)
        inside = wrapped[wrapped.index(in_containers.plan.containers.image_of(spec.name)) + 1 :]  # type: ignore[union-attr]
        assert inside == ["python", *plain[1:]]  # the image's interpreter, every flag the same
        assert state.process_marker(name) in wrapped  # `running_pid` tells the container's PID 1 by it
    mgmtd = command(spec_for(processes.plan.find("mgmtd-1")), in_containers, processes.plan.find("mgmtd-1"))
    assert _options(mgmtd, "--env") == ["FF_MGMTD_DATABASE_URL"]


def test_the_container_plan_survives_plan_json_and_a_grown_plan(tmp_path: Path) -> None:
    plan = _plan(_containers())
    assert ClusterPlan.from_json(plan.to_json()) == plan
    grown = extend_plan(plan, {"agent": 2}, {"mgmtd": 1, "agent": 1}, lambda n, used: [9001, 9002][:n])
    assert grown.containers == plan.containers and len(grown.instances) == 3


def test_a_plan_naming_containers_fireflyer_did_not_make_is_refused() -> None:
    doc = _plan(_containers()).to_json().replace("ff-0a1b2c", "web-server")
    with pytest.raises(PlanError, match="not containers made by fireflyer"):
        ClusterPlan.from_json(doc)


def test_remove_stops_with_a_grace_and_ignores_missing_containers() -> None:
    assert remove_argv(["ff-0a1b2c-mgmtd-1"]) == [
        "podman",
        "rm",
        "--force",
        "--ignore",
        "--time",
        "5",
        "ff-0a1b2c-mgmtd-1",
    ]


def test_containers_is_for_a_new_cluster_of_processes_only(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.create_dirs()
    with pytest.raises(ContainersError, match="--hosts do not go together"):
        container_layout.choose(state, True, True, (), {})
    save_plan(state, _plan(None))
    with pytest.raises(ContainersError, match="runs as processes"):
        container_layout.choose(state, True, False, (), {})
    assert container_layout.choose(state, False, False, (), {}) is None


def test_trainer_image_picks_the_agents_image_of_a_new_container_cluster_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(container_layout.containers, "check_can_run", lambda plan, env: None)
    state = StateDir(tmp_path)
    state.create_dirs()
    services = ImageNames(version=project_version()).services
    with pytest.raises(ContainersError, match="--trainer-image goes with --containers"):
        container_layout.choose(state, False, False, (), {}, services)
    chosen = container_layout.choose(state, True, False, (), {}, services)
    assert chosen is not None and chosen.trainer_image == chosen.services_image == services
    assert run_argv(chosen, instance="agent-1", service="agent", argv=["python"])[-2] == chosen.services_image
    save_plan(state, _plan(chosen))
    assert container_layout.choose(state, False, False, (), {}) == chosen  # kept for later ups
    assert container_layout.choose(state, False, False, (), {}, chosen.trainer_image) == chosen
    with pytest.raises(ContainersError, match="chosen at its first up"):
        container_layout.choose(state, False, False, (), {}, IMAGES.trainer)


def test_debootstrap_makes_a_minbase_with_python_and_the_cache_key_follows_its_inputs(tmp_path: Path) -> None:
    argv = debootstrap_argv("bookworm", "http://mirror/debian", tmp_path / "rootfs")
    assert argv == [
        "debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates", "bookworm",
        str(tmp_path / "rootfs"), "http://mirror/debian",
    ]  # fmt: skip
    key = base_key("bookworm", "http://mirror/debian")
    assert key == base_key("bookworm", "http://mirror/debian", ["ca-certificates", "python3-venv", "python3"])
    assert len({key, base_key("trixie", "http://mirror/debian"), base_key("bookworm", "http://other")}) == 3
    assert "--exclude=./var/cache/apt/archives/*.deb" in tar_argv(tmp_path, tmp_path / "b.tar")
    assert import_argv(tmp_path / "b.tar", IMAGES.base)[-2:] == [str(tmp_path / "b.tar"), IMAGES.base]


def test_wheels_are_built_from_absolute_paths_with_their_extras(tmp_path: Path) -> None:
    argv = wheel_argv("/py", Path("/repo"), tmp_path, ["/opt/wheels"])
    assert argv[:4] == ["/py", "-m", "pip", "wheel"]
    assert _options(argv, "-c") == ["/repo/requirements/constraints.txt"]
    assert _options(argv, "--find-links") == ["/opt/wheels"]
    assert _options(argv, "--wheel-dir") == [str(tmp_path)]
    sources = argv[-len(WHEEL_SOURCES) :]
    assert "/repo/appliance" in sources  # a bare "appliance" would be an unrelated PyPI project
    assert "/repo/libs/hfreduce[torch]" in sources
    assert all(s.startswith("/repo/") for s in sources)
    services_only = wheel_argv("/py", Path("/repo"), tmp_path, (), SERVICES_WHEEL_SOURCES)
    assert "/repo/libs/hfreduce" in services_only and "/repo/appliance" in services_only
    assert not any("torch" in a or "haiscale" in a for a in services_only)  # --services-only fetches no torch


def test_image_builds_mount_the_wheels_and_need_no_runtime(tmp_path: Path) -> None:
    argv = build_argv(Path("/ctx/trainer.Containerfile"), IMAGES.trainer, Path("/ctx"), tmp_path, {"VERSION": "1"})
    assert argv[:4] == ["podman", "build", "--isolation", "chroot"]
    assert _options(argv, "--volume") == [f"{tmp_path}:/wheels:ro"]
    assert _options(argv, "--build-arg") == ["VERSION=1"]
    assert _options(argv, "--tag") == [IMAGES.trainer] and argv[-1] == "/ctx"
    assert "torch==2.13.0" in TRAINER_PACKAGES and not any("torch" in p for p in SERVICES_PACKAGES)


def test_the_cli_takes_image_build_and_up_containers() -> None:
    args = build_parser().parse_args(["image", "build", "--cache-dir", "/c", "--find-links", "/w", "--rebuild-base"])
    assert (args.cache_dir, args.find_links, args.rebuild_base, args.version) == ("/c", ["/w"], True, None)
    assert build_parser().parse_args(["up", "--containers"]).containers is True
    assert build_parser().parse_args(["demo", "--quick", "--containers"]).containers is True
    assert build_parser().parse_args(["up"]).containers is False
    assert build_parser().parse_args(["image", "build"]).services_only is False
    assert build_parser().parse_args(["image", "build", "--services-only"]).services_only is True
    up = build_parser().parse_args(["up", "--containers", "--trainer-image", IMAGES.services])
    assert up.trainer_image == IMAGES.services
    assert default_cache_dir({"HOME": "/h"}) == Path("/h/.cache/fireflyer/images")
    assert default_cache_dir({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/fireflyer/images")


def _wheel(path: Path, members: dict[str, bytes], date: tuple[int, int, int, int, int, int]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=date), data)


def test_the_wheels_digest_follows_their_contents_not_their_build_times(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    _wheel(first / "ff_x-1-py3-none-any.whl", {"ff_x/__init__.py": b"A = 1\n"}, (2026, 1, 1, 0, 0, 0))
    _wheel(second / "ff_x-1-py3-none-any.whl", {"ff_x/__init__.py": b"A = 1\n"}, (2026, 11, 27, 4, 0, 0))
    assert wheels_digest(first) == wheels_digest(second)  # built again from the same sources: the cache holds
    _wheel(second / "ff_x-1-py3-none-any.whl", {"ff_x/__init__.py": b"A = 2\n"}, (2026, 11, 27, 4, 0, 0))
    assert wheels_digest(first) != wheels_digest(second)  # a changed source: the install runs again
