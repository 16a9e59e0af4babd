"""ff_cluster's names load on first use: a client takes MgmtdClient without the service chassis and its settings."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import ff_cluster

pytestmark = pytest.mark.unit


def test_every_exported_name_is_the_one_its_module_defines() -> None:
    for name in ff_cluster.__all__:
        value = getattr(ff_cluster, name)
        assert value is getattr(importlib.import_module(value.__module__), name), name
    assert set(dir(ff_cluster)) >= set(ff_cluster.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        ff_cluster.Nope  # noqa: B018


def test_the_client_loads_without_the_chassis() -> None:
    # A fresh interpreter: this one has imported whatever other tests needed.
    probe = (
        "import sys\nfrom ff_cluster import MgmtdClient\n"
        "print(sorted(m for m in ('ff_cluster.chassis', 'ff_config', 'pydantic') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout
