"""The SDK's run-control hooks without a run: what they accept, and what they do outside a task."""

from __future__ import annotations

import pytest

from hfai import client, runcontrol

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("bad", [1.5, True, 2**63, "3"])
def test_whole_life_state_must_be_a_64_bit_int(bad: object) -> None:
    with pytest.raises(ValueError, match="64-bit"):
        client.set_whole_life_state(bad)  # type: ignore[arg-type]


def test_hooks_outside_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runcontrol.RUN_DIR_ENV, raising=False)
    monkeypatch.delenv(client.WHOLE_LIFE_STATE_ENV, raising=False)
    monkeypatch.setattr(client, "_state", {})
    assert client.receive_suspend_command() is False and client.get_whole_life_state() == 0
    with pytest.raises(client.NotInTask):
        client.go_suspend()
