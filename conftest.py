"""Marks every test by the folder it lives in: tests/unit, tests/integration or tests/e2e."""

from __future__ import annotations

import pytest

# Shared fixtures (databases, ports) for every package's tests.
pytest_plugins = ["ff_testing.pytest_plugin"]

LEVELS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        level = next((p for p in reversed(parts) if p in LEVELS), None)
        if level is None:
            raise pytest.UsageError(f"{item.path}: tests must live under a unit/, integration/ or e2e/ folder")
        item.add_marker(getattr(pytest.mark, level))
