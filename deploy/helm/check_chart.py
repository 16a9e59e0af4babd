"""The chart's checks (``tox -e helm``): for every values file in ``fireflyer/ci/``, ``helm lint --strict`` and
``helm template | kubernetes-validate --strict`` against the oldest Kubernetes the chart supports and the newest
kubernetes-validate knows.

    python deploy/helm/check_chart.py [--helm PATH]     # helm: $FF_HELM, else .tools/bin/helm (scripts/get_helm.py)

kubernetes-validate must be on PATH (tox installs it into the helm env). Exit 1 when any check fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHART = Path(__file__).resolve().parent / "fireflyer"
ROOT = CHART.parents[2]
KUBE_VERSIONS = ("1.27.0", "1.37.0")
RELEASE, NAMESPACE = "ff", "fireflyer"


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, text=True, capture_output=True, check=False)


def check(helm: str, values: Path, out_dir: Path) -> list[str]:
    """The failures of one values file (empty: it passed)."""
    failures = []
    lint = run([helm, "lint", "--strict", str(CHART), "-f", str(values)])
    if lint.returncode != 0:
        failures.append(f"helm lint --strict -f {values.name}:\n{lint.stdout}{lint.stderr}")
    rendered = run([helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values)])
    if rendered.returncode != 0:
        return [*failures, f"helm template -f {values.name}:\n{rendered.stderr}"]
    manifest = out_dir / f"{values.stem}.yaml"
    manifest.write_text(rendered.stdout)
    for version in KUBE_VERSIONS:
        validated = run(["kubernetes-validate", "--strict", "-k", version, "--quiet", str(manifest)])
        if validated.returncode != 0:
            failures.append(f"kubernetes-validate --strict -k {version} ({values.name}):\n{validated.stdout}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_helm = os.environ.get("FF_HELM") or str(ROOT / ".tools" / "bin" / "helm")
    parser.add_argument("--helm", default=default_helm, help="the helm binary")
    args = parser.parse_args(argv)
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ff-helm-") as tmp:
        env_dirs = {f"HELM_{d}_HOME": str(Path(tmp) / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}
        os.environ.update(env_dirs)  # helm writes nothing under ~
        for values in sorted((CHART / "ci").glob("*.yaml")):
            started = time.monotonic()
            problems = check(args.helm, values, Path(tmp))
            verdict = "FAILED" if problems else "ok"
            print(f"{values.name}: lint, template, validate ({', '.join(KUBE_VERSIONS)}): {verdict} "
                  f"in {time.monotonic() - started:.1f}s")  # fmt: skip
            failures += problems
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
