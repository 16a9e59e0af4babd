from __future__ import annotations

import math

import pytest

from hfai import telemetry


def test_the_agents_labels_win_over_the_callers() -> None:
    agent = telemetry._agent_labels({"FF_TELEMETRY_LABELS": '{"task_id": "7", "rank": 3}'})
    assert agent == {"task_id": "7", "rank": "3"}
    # The agent's go with every push as common labels; the caller's of the same names are left out.
    assert telemetry.sample_labels({"rank": "0", "phase": "eval"}, agent) == {"phase": "eval"}


def test_labels_outside_a_task_or_malformed_are_empty() -> None:
    assert telemetry._agent_labels({}) == {}
    assert telemetry._agent_labels({"FF_TELEMETRY_LABELS": "not json"}) == {}
    assert telemetry._agent_labels({"FF_TELEMETRY_LABELS": "[1, 2]"}) == {}


def test_values_must_be_numbers_and_names_valid() -> None:
    with pytest.raises(TypeError, match="loss='high'"):
        telemetry.report(loss="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'bad-name'"):
        telemetry.report(**{"bad-name": 1.0})
    with pytest.raises(ValueError, match="'__x'"):
        telemetry.report(labels={"__x": "1"}, loss=1.0)


def test_non_finite_values_are_numbers_too() -> None:
    assert math.isnan(telemetry._number("loss", float("nan")))
    assert telemetry._number("loss", "inf") == math.inf
