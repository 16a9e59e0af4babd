"""The agent's last report of its runs at shutdown is best effort: a scheduler that is gone, or that takes the
report and never answers, does not make the agent's stop fail."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from ff_agent.server import _final_report


@dataclass
class _Run:
    final_reported: bool = False

    def report(self, node_id: str) -> str:
        return f"run on {node_id}"


@dataclass
class _Link:
    """A scheduler link whose report never answers (the scheduler accepted the call and went away)."""

    calls: list[list[str]] = field(default_factory=list)

    async def report_runs(self, reports: list[str]) -> None:
        self.calls.append(reports)
        await asyncio.Event().wait()


@dataclass
class _Runs:
    runs: dict[str, _Run]


@dataclass
class _Agent:
    node_id: str
    runs: _Runs
    link: _Link


async def test_a_report_the_scheduler_never_answers_ends_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    agent: Any = _Agent("n1", _Runs({"a": _Run(), "b": _Run(final_reported=True)}), _Link())
    with caplog.at_level(logging.WARNING, logger="ff_agent.server"):
        await _final_report(agent, timeout_s=0.01)
    assert agent.link.calls == [["run on n1"]]
    assert "did not reach the scheduler" in caplog.text
