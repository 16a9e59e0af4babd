"""The import contract that keeps protobuf at the storage node's edges can fail: run word for word on probe modules
named as the node's, it breaks on a module that imports generated code itself, and lets one reach it through
``peers`` (an edge, which the node calls by design)."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
from importlinter import configuration
from importlinter.application import use_cases

REPO = Path(__file__).resolve().parents[4]
CONTRACT = "importlinter:contract:storage-node-below-the-edge"
GENERATED = "from fireflyer.storage.v1 import storage_pb2\n\nMESSAGES = storage_pb2\n"


def _real_contract() -> configparser.SectionProxy:
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    return config[CONTRACT]


def test_the_contract_covers_the_node_below_the_servicer() -> None:
    sources = set(_real_contract()["source_modules"].split())
    below = {"ff_storage.node", "ff_storage.node_state", "ff_storage.writes", "ff_storage.reads", "ff_storage.recovery"}
    assert below <= sources
    assert {"ff_storage.servicer", "ff_storage.peers", "ff_storage.wire", "ff_storage.dataserver"}.isdisjoint(sources)


def test_the_contract_fails_on_a_node_module_importing_generated_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    probe = tmp_path / "probe_node"
    probe.mkdir()
    (probe / "__init__.py").write_text("")
    (probe / "writes.py").write_text(GENERATED)  # what the node's writer must not do
    (probe / "peers.py").write_text(GENERATED)  # an edge
    (probe / "reads.py").write_text("from probe_node import peers\n\nPEERS = peers\n")  # through the edge: allowed
    contract = _real_contract()
    lines = [
        "[importlinter]",
        "root_packages =\n    probe_node",
        "include_external_packages = True",
        f"[{CONTRACT}]",
        *(f"{k} = " + v.replace("\n", "\n    ") for k, v in contract.items() if k != "source_modules"),
        "source_modules =\n    probe_node.writes\n    probe_node.reads",
    ]
    config = tmp_path / "importlinter.ini"
    config.write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    configuration.configure()
    kept = use_cases.lint_imports(config_filename=str(config), cache_dir=None, no_logo=True)
    report = capsys.readouterr().out
    assert not kept, report
    assert "probe_node.writes is not allowed to import fireflyer" in report
    assert "probe_node.reads" not in report.split("Broken contracts")[-1]
