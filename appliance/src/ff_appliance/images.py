"""``fireflyer image build``: the services' and the trainers' OCI images, without a daemon, from a base of our own.

No registry is reachable from our machines, so nothing starts ``FROM`` a published image:

1. the base image ``localhost/fireflyer/base:<version>`` is a Debian minbase root file system with python3 made by
   ``debootstrap`` (the tarball is cached, keyed by suite, mirror and packages: about 90 s the first time) and
   imported with ``podman import``;
2. the monorepo's packages and every dependency are built or fetched into a wheel folder on this machine
   (``pip wheel``, with pip's own configuration: torch 2.13.0 CPU comes from the local wheel folder it names);
3. ``podman build --isolation chroot`` (no OCI runtime, no daemon) runs ``deploy/images/services.Containerfile``
   and ``trainer.Containerfile`` with that folder bind-mounted at ``/wheels``: installing needs no network.

The argv builders are pure (unit-tested); ``build_images`` does the I/O.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
IMAGE_PREFIX = "localhost/fireflyer"
# The monorepo's packages the wheel folder is built from (paths in the checkout), and what each image installs
# from it by name (the rest comes in as their dependencies).
WHEEL_SOURCES = (
    "libs/proto", "libs/config", "libs/rpc", "libs/store", "libs/cluster", "libs/telemetry_client",
    "libs/fsprotocol", "libs/hfreduce[torch]", "libs/hf3fs", "libs/hfai", "libs/haiscale",
    "services/mgmtd", "services/storage", "services/meta", "services/scheduler", "services/agent",
    "services/telemetry", "appliance",
)  # fmt: skip
# What the services image alone needs (``--services-only``): no torch, so no haiscale and hfreduce without its extra.
SERVICES_WHEEL_SOURCES = tuple(
    source.split("[")[0] for source in WHEEL_SOURCES if not source.startswith("libs/haiscale")
)
SERVICES_PACKAGES = ("ff-appliance", "ff-scheduler", "hfai")
TRAINER_PACKAGES = ("torch==2.13.0", "haiscale", "hfreduce[torch]")
CONTAINERFILES = Path("deploy/images")
# Tools the build runs, with the Debian package each comes in (scripts/bootstrap.sh installs them when root).
TOOLS = {"podman": "podman", "debootstrap": "debootstrap", "tar": "tar"}


class ImageError(Exception):
    """An image could not be built; the message says which step failed and why."""


@dataclass(frozen=True, kw_only=True)
class ImageNames:
    """The three images of one version (the chart's ``fireflyer/services`` and ``fireflyer/trainer``)."""

    version: str

    @property
    def base(self) -> str:
        """Debian minbase with python3: what the services image starts from."""
        return f"{IMAGE_PREFIX}/base:{self.version}"

    @property
    def services(self) -> str:
        """mgmtd, meta, storage, the scheduler, telemetry, the agent, the CLI."""
        return f"{IMAGE_PREFIX}/services:{self.version}"

    @property
    def trainer(self) -> str:
        """The services image plus torch, haiscale and hfreduce's torch backend: the agents and their ranks."""
        return f"{IMAGE_PREFIX}/trainer:{self.version}"


def project_version() -> str:
    """The version images are tagged with: the appliance's (the chart's appVersion is the same)."""
    return importlib.metadata.version("ff-appliance")


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """How ``fireflyer image build`` builds.

    Attributes:
        checkout: the monorepo's root (its packages and ``deploy/images``).
        cache_dir: where the base root file system's tarball is kept between builds.
        env: environment of the commands run (podman reads ``CONTAINERS_STORAGE_CONF`` from it, pip its ``PIP_*``).
        version: the tag; the appliance's version by default.
        suite, mirror: what debootstrap installs, and from where.
        find_links: extra folders of wheels for ``pip wheel`` (besides pip's own configuration).
        rebuild_base: make the base image again even if it exists (a new debootstrap only if not cached).
        with_trainer: build the trainer image too (torch: most of a build's time); False builds base and services.
        python: the interpreter that builds the wheels (the one running this, with setuptools).
    """

    checkout: Path
    cache_dir: Path
    env: Mapping[str, str]
    version: str = field(default_factory=project_version)
    suite: str = DEFAULT_SUITE
    mirror: str = DEFAULT_MIRROR
    find_links: tuple[str, ...] = ()
    rebuild_base: bool = False
    with_trainer: bool = True
    python: str = sys.executable


def find_checkout(given: str | None) -> Path:
    """``given``, else the checkout this package is installed from (editable); it must hold the Containerfiles.

    Raises:
        ImageError: no such folder, or it is not a checkout of the monorepo.
    """
    import ff_appliance

    root = Path(given).expanduser().resolve() if given else Path(ff_appliance.__file__).resolve().parents[3]
    if not (root / CONTAINERFILES / "services.Containerfile").is_file():
        raise ImageError(
            f"{root} is not a checkout of the monorepo (no {CONTAINERFILES}/services.Containerfile): pass --source "
            "with the checkout's folder"
        )
    return root


def base_key(suite: str, mirror: str, packages: Sequence[str] = BASE_PACKAGES) -> str:
    """What the cached base tarball's name depends on: another suite, mirror or package list makes a new one."""
    text = "\n".join([suite, mirror, *sorted(packages)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def debootstrap_argv(suite: str, mirror: str, target: Path, packages: Sequence[str] = BASE_PACKAGES) -> list[str]:
    """A Debian minbase root file system with ``packages`` in ``target``."""
    return ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(target), mirror]


def tar_argv(rootfs: Path, tarball: Path) -> list[str]:
    """The root file system as a tarball, without the downloaded .deb files (40 MB nobody needs in the image)."""
    return ["tar", "-C", str(rootfs), "--exclude=./var/cache/apt/archives/*.deb", "-cf", str(tarball), "."]


def import_argv(tarball: Path, tag: str) -> list[str]:
    """``podman import`` of the base tarball as ``tag``."""
    return ["podman", "import", "--change", 'CMD ["/usr/bin/python3"]', str(tarball), tag]


def wheel_argv(
    python: str, checkout: Path, wheel_dir: Path, find_links: Sequence[str] = (), sources: Sequence[str] = WHEEL_SOURCES
) -> list[str]:
    """``pip wheel`` of the monorepo's packages and all their dependencies into ``wheel_dir``.

    Paths start with ``./`` relative to nothing: they are absolute (a bare ``appliance`` would be a PyPI name).
    ``--no-build-isolation``: every package needs only setuptools, which the running environment has.
    """
    argv = [
        python, "-m", "pip", "wheel", "--disable-pip-version-check", "--quiet", "--no-build-isolation",
        "-c", str(checkout / "requirements" / "constraints.txt"), "--wheel-dir", str(wheel_dir),
    ]  # fmt: skip
    for folder in find_links:
        argv += ["--find-links", folder]
    return argv + [str(checkout / source.split("[")[0]) + _extras(source) for source in sources]


def wheels_digest(wheel_dir: Path) -> str:
    """A digest of the wheels' contents (names, sizes and CRCs of their members, not their zip timestamps).

    It goes into the images as a label before their install step: podman's layer cache would otherwise reuse an
    install of older wheels (the bind-mounted folder is not part of its cache key), and wheels built again from the
    same sources reuse it.
    """
    digest = hashlib.sha256()
    for wheel in sorted(wheel_dir.glob("*.whl")):
        digest.update(wheel.name.encode())
        with zipfile.ZipFile(wheel) as archive:
            for member in sorted(archive.infolist(), key=lambda m: m.filename):
                digest.update(f"{member.filename}:{member.file_size}:{member.CRC}".encode())
    return digest.hexdigest()[:16]


def _extras(source: str) -> str:
    _, bracket, extras = source.partition("[")
    return bracket + extras if bracket else ""


def build_argv(
    containerfile: Path, tag: str, context: Path, wheel_dir: Path, build_args: Mapping[str, str]
) -> list[str]:
    """``podman build`` of one Containerfile, the wheels bind-mounted read-only at ``/wheels``.

    ``--isolation chroot``: RUN steps need no OCI runtime (crun fails on this machine's hybrid cgroups) and no
    raised ulimits.
    """
    argv = ["podman", "build", "--isolation", "chroot", "--file", str(containerfile), "--tag", tag]
    argv += ["--volume", f"{wheel_dir}:/wheels:ro"]
    for name, value in build_args.items():
        argv += ["--build-arg", f"{name}={value}"]
    return [*argv, str(context)]


def image_exists_argv(tag: str) -> list[str]:
    """Exit 0 when ``tag`` is in podman's local storage."""
    return ["podman", "image", "exists", tag]


def check_tools(tools: Mapping[str, str] = TOOLS) -> None:
    """Every tool the build runs is installed, and we are root (debootstrap and rootful podman).

    Raises:
        ImageError: one is missing (named with its Debian package), or not root.
    """
    missing = [f"{tool} (apt package {package})" for tool, package in tools.items() if shutil.which(tool) is None]
    if missing:
        raise ImageError(f"building images needs {', '.join(missing)}; scripts/bootstrap.sh installs them as root")
    if os.geteuid() != 0:
        raise ImageError("building images needs root (debootstrap, and podman's rootful storage)")


def build_images(options: BuildOptions, out: TextIO) -> ImageNames:
    """Build the base (when missing or asked), services and (``with_trainer``) trainer images of ``options.version``.

    Raises:
        ImageError: a tool is missing or a step failed (its output's tail is in the message).
    """
    check_tools()
    names = ImageNames(version=options.version)
    env = dict(options.env)
    if options.rebuild_base or not _exists(names.base, env):
        _make_base(options, names.base, env, out)
    else:
        print(f"image: {names.base} exists (--rebuild-base makes it again)", file=out, flush=True)
    with tempfile.TemporaryDirectory(prefix="ff-wheels-", dir=options.cache_dir) as tmp:
        wheel_dir = Path(tmp)
        sources = WHEEL_SOURCES if options.with_trainer else SERVICES_WHEEL_SOURCES
        _step(out, "wheels of the monorepo and its dependencies (pip wheel)",
              wheel_argv(options.python, options.checkout, wheel_dir, options.find_links, sources), env)  # fmt: skip
        context = options.checkout / CONTAINERFILES
        digest = wheels_digest(wheel_dir)
        to_build = [(names.services, "services.Containerfile",
                   {"BASE_IMAGE": names.base, "PACKAGES": " ".join(SERVICES_PACKAGES)})]  # fmt: skip
        if options.with_trainer:
            to_build.append((names.trainer, "trainer.Containerfile",
                           {"SERVICES_IMAGE": names.services, "PACKAGES": " ".join(TRAINER_PACKAGES)}))  # fmt: skip
        for tag, containerfile, args in to_build:
            build_args = {**args, "VERSION": options.version, "WHEELS_DIGEST": digest}
            _step(out, tag, build_argv(context / containerfile, tag, context, wheel_dir, build_args), env)
    return names


def _make_base(options: BuildOptions, tag: str, env: dict[str, str], out: TextIO) -> None:
    options.cache_dir.mkdir(parents=True, exist_ok=True)
    tarball = options.cache_dir / f"base-{options.suite}-{base_key(options.suite, options.mirror)}.tar"
    if tarball.is_file():
        print(f"image: base root file system cached in {tarball}", file=out, flush=True)
    else:
        with tempfile.TemporaryDirectory(prefix="ff-rootfs-", dir=options.cache_dir) as tmp:
            rootfs = Path(tmp) / "rootfs"
            _step(out, f"debootstrap {options.suite} minbase with {', '.join(BASE_PACKAGES)}",
                  debootstrap_argv(options.suite, options.mirror, rootfs), env)  # fmt: skip
            partial = tarball.with_suffix(".partial")
            _step(out, f"tarball {tarball}", tar_argv(rootfs, partial), env)
            partial.replace(tarball)  # only a whole tarball is ever found in the cache
    _step(out, tag, import_argv(tarball, tag), env)


def _exists(tag: str, env: Mapping[str, str]) -> bool:
    return subprocess.run(image_exists_argv(tag), env=dict(env), capture_output=True, check=False).returncode == 0


def _step(out: TextIO, what: str, argv: list[str], env: Mapping[str, str]) -> None:
    """Run one build step, saying what and how long; its output is shown only when it fails."""
    print(f"image: {what} ...", file=out, flush=True)
    started = time.monotonic()
    proc = subprocess.run(argv, env=dict(env), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join(f"  | {line}" for line in (proc.stdout + proc.stderr).splitlines()[-25:])
        raise ImageError(f"{what}: `{' '.join(argv[:4])} ...` exited with {proc.returncode}\n{tail}")
    print(f"image: {what}: done in {time.monotonic() - started:.0f} s", file=out, flush=True)
