"""The order in which a stage runs its micro-batches' forwards and backwards (pure: no torch, no I/O)."""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class Action:
    """Run the forward (``"F"``) or the backward (``"B"``) of micro-batch ``micro``."""

    kind: Literal["F", "B"]
    micro: int


def gpipe(num_micro: int, stage: int, num_stages: int) -> list[Action]:
    """GPipe: every forward, then every backward (last micro-batch first).

    Each stage holds all ``num_micro`` micro-batches' activations at the turn.
    """
    _check(num_micro, stage, num_stages)
    return [Action("F", i) for i in range(num_micro)] + [Action("B", i) for i in reversed(range(num_micro))]


def one_f_one_b(num_micro: int, stage: int, num_stages: int) -> list[Action]:
    """PipeDream's 1F1B, with a flush at the end of the step.

    ``num_stages - stage - 1`` warm-up forwards, then one forward and one backward in turn, then the remaining
    backwards. Stage ``s`` holds at most ``num_stages - s`` micro-batches' activations.
    """
    _check(num_micro, stage, num_stages)
    warmup = min(num_stages - stage - 1, num_micro)
    actions = [Action("F", i) for i in range(warmup)]
    backward = 0
    for forward in range(warmup, num_micro):
        actions.append(Action("F", forward))
        actions.append(Action("B", backward))
        backward += 1
    actions.extend(Action("B", i) for i in range(backward, num_micro))
    return actions


def peak_in_flight(actions: list[Action]) -> int:
    """The most micro-batches whose forward ran and backward did not yet, over the schedule."""
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == "F" else -1
        peak = max(peak, live)
    return peak


def ideal_bubble(num_micro: int, num_stages: int) -> float:
    """The idle fraction of a step when every stage takes the same time per micro-batch: (p - 1) / (m + p - 1)."""
    return (num_stages - 1) / (num_micro + num_stages - 1)


def _check(num_micro: int, stage: int, num_stages: int) -> None:
    if num_micro < 1:
        raise ValueError(f"chunks (micro-batches per step) must be at least 1, got {num_micro}")
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage} not in [0, {num_stages})")
