"""The core-is-pure import contract can fail: run on a module that loads grpc only through a package
``__init__``, it breaks; on a pure module it holds."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTRACT = "importlinter:contract:core-is-pure"


def _probe_config(real: configparser.ConfigParser) -> str:
    """The repository's contract, word for word, with two probe packages as its sources."""
    top, contract = real["importlinter"], real[CONTRACT]
    out = configparser.ConfigParser()
    out["importlinter"] = {
        "root_packages": top["root_packages"] + "\nprobe_bad\nprobe_good",
        "include_external_packages": top["include_external_packages"],
        "contract_types": top["contract_types"],
    }
    for name in ("bad", "good"):
        out[f"importlinter:contract:probe-{name}"] = {
            **contract,
            "name": f"probe {name}",
            "source_modules": f"probe_{name}.core",
        }
    lines: list[str] = []
    for section in out.sections():
        lines.append(f"[{section}]")
        lines += [f"{key} = " + value.replace("\n", "\n    ") for key, value in out[section].items()]
    return "\n".join(lines) + "\n"


def _write_probe(root: Path, name: str, body: str) -> None:
    core = root / name / "core"
    core.mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (core / "__init__.py").write_text("")
    (core / "rules.py").write_text(body)


def test_core_contract_fails_on_grpc_loaded_through_a_package_init(tmp_path: Path) -> None:
    real = configparser.ConfigParser()
    real.read(REPO / ".importlinter")
    # ff_cluster.lease itself imports nothing but dataclasses; ff_cluster/__init__ loads grpc.
    _write_probe(tmp_path, "probe_bad", "from ff_cluster.lease import LeaseWatch\n\nWATCH = LeaseWatch\n")
    _write_probe(tmp_path, "probe_good", "import dataclasses\n\nFIELD = dataclasses.field\n")
    config = tmp_path / "importlinter.ini"
    config.write_text(_probe_config(real))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--config", str(config), "--no-cache", "--no-logo"],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    report = done.stdout + done.stderr
    assert done.returncode == 1, report
    assert "probe bad BROKEN" in report
    assert "probe good KEPT" in report
    assert "probe_bad.core is not allowed to import grpc" in report
    assert "probe_bad.core.rules -> ff_cluster.lease" in report
