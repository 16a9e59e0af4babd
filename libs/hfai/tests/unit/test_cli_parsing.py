"""The CLI's parsing of a submit's arguments and of priorities, without a cluster."""

from __future__ import annotations

import pytest

from hfai.cli import CliError, parse_priority, split_submit

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("args", "script", "cluster", "local"),
    [
        (["train.py", "--lr", "1"], ["train.py", "--lr", "1"], None, None),
        (["train.py", "--", "--nodes", "2"], ["train.py"], ["--nodes", "2"], None),
        (["train.py", "x", "++", "-ss", "5"], ["train.py", "x"], None, ["-ss", "5"]),
    ],
)
def test_split_submit(args: list[str], script: list[str], cluster: list[str] | None, local: list[str] | None) -> None:
    assert split_submit(args) == (script, cluster, local)


def test_parse_priority() -> None:
    assert parse_priority("30") == 30 and parse_priority("high") == 30 and parse_priority("auto") is None
    with pytest.raises(CliError):
        parse_priority("urgent")
