"""HAI-Platform's priority levels (``conf/server_flags/default.py``) and their checks."""

from __future__ import annotations

EXTREME_HIGH = 50
VERY_HIGH = 40
HIGH = 30
ABOVE_NORMAL = 20
NORMAL = 10
UNDER_NORMAL = 8
BELOW_NORMAL = 5
LOW = 0

NAMES: dict[int, str] = {
    EXTREME_HIGH: "EXTREME_HIGH",
    VERY_HIGH: "VERY_HIGH",
    HIGH: "HIGH",
    ABOVE_NORMAL: "ABOVE_NORMAL",
    NORMAL: "NORMAL",
    UNDER_NORMAL: "UNDER_NORMAL",
    BELOW_NORMAL: "BELOW_NORMAL",
    LOW: "LOW",
}
# Highest first: the order AUTO tries them in.
LEVELS: tuple[int, ...] = tuple(sorted(NAMES, reverse=True))

# ABOVE_NORMAL drops to NORMAL after this long running (HAI guide/schedule.md).
DEMOTE_AFTER_S = 30 * 60.0


def is_level(value: int) -> bool:
    """Whether ``value`` is one of the priority levels."""
    return value in NAMES


def parse(text: str) -> int:
    """A level from its number (``"30"``) or its name (``"high"``, ``"ABOVE_NORMAL"``).

    Raises:
        ValueError: not a level.
    """
    name = text.strip().upper().replace("-", "_")
    for level, level_name in NAMES.items():
        if name == level_name:
            return level
    try:
        value = int(name)
    except ValueError:
        raise ValueError(f"unknown priority {text!r}; levels: {describe_levels()}") from None
    if not is_level(value):
        raise ValueError(f"priority {value} is not a level; levels: {describe_levels()}")
    return value


def describe_levels() -> str:
    """The levels as ``NAME=value`` pairs, for error messages."""
    return ", ".join(f"{NAMES[v]}={v}" for v in LEVELS)


def name(level: int) -> str:
    """The level's name, or its number when it is not a level."""
    return NAMES.get(level, str(level))


def demoted(priority: int, running_s: float, demote_after_s: float = DEMOTE_AFTER_S) -> int:
    """The priority in force for a run at ``priority`` that has been running ``running_s``."""
    if priority == ABOVE_NORMAL and running_s >= demote_after_s:
        return NORMAL
    return priority
