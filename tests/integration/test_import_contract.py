"""The import contracts can fail: core-is-pure, run on a module that loads grpc only through a package
``__init__``, breaks (on a pure module it holds); the layers contract breaks on a service importing ff_testing."""

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
    return _render(out)


def _render(config: configparser.ConfigParser) -> str:
    """``config`` as import-linter reads it (continuation lines indented)."""
    lines: list[str] = []
    for section in config.sections():
        lines.append(f"[{section}]")
        lines += [f"{key} = " + value.replace("\n", "\n    ") for key, value in config[section].items()]
    return "\n".join(lines) + "\n"


def _lint_imports(root: Path, config: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """lint-imports with ``config``, the probe packages in ``root`` importable; the run and its report."""
    path = root / "importlinter.ini"
    path.write_text(config)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--config", str(path), "--no-cache", "--no-logo"],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done, done.stdout + done.stderr


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
    done, report = _lint_imports(tmp_path, _probe_config(real))
    assert done.returncode == 1, report
    assert "probe bad BROKEN" in report
    assert "probe good KEPT" in report
    assert "probe_bad.core is not allowed to import grpc" in report
    assert "probe_bad.core.rules -> ff_cluster.lease" in report


def test_layers_contract_fails_on_production_code_importing_the_test_harness(tmp_path: Path) -> None:
    """ff_testing is the top layer: a service (here a probe in the services' layer) may not import it."""
    real = configparser.ConfigParser()
    real.read(REPO / ".importlinter")
    top, layers = real["importlinter"], real["importlinter:contract:layers"]
    services = next(line for line in layers["layers"].splitlines() if "ff_mgmtd" in line)
    out = configparser.ConfigParser()
    out["importlinter"] = {
        "root_packages": top["root_packages"] + "\nprobe_service",
        "include_external_packages": top["include_external_packages"],
        "contract_types": top["contract_types"],
    }
    out["importlinter:contract:layers"] = {
        **layers,
        "layers": layers["layers"].replace(services, services + " | probe_service"),
    }
    (tmp_path / "probe_service").mkdir()
    (tmp_path / "probe_service" / "__init__.py").write_text("")
    (tmp_path / "probe_service" / "server.py").write_text(
        "from ff_testing.waiting import eventually\n\nWAIT = eventually\n"
    )
    done, report = _lint_imports(tmp_path, _render(out))
    assert done.returncode == 1, report
    assert "BROKEN" in report and "probe_service.server -> ff_testing.waiting" in report, report
