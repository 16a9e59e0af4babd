"""The fast path takes call metadata as gRPC does: keys lowercased, text keys only, printable ASCII values."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ff_rpc.fastpath import FrameError, _metadata


def test_keys_are_lowercased_and_values_kept() -> None:
    got = _metadata([["X-Request-ID", "abc"], ["a.b_c-d", " ~"], ["authorization", "Bearer t"]])
    assert got == (("x-request-id", "abc"), ("a.b_c-d", " ~"), ("authorization", "Bearer t"))
    assert _metadata([]) == ()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("x", "list of [key, value]"),
        ([["a"]], "list of [key, value]"),
        ([("a", "b")], "list of [key, value]"),
        ([["a", 1]], "list of [key, value]"),
        ([["ok", "v"], ["k y", "v"], ["x"]], "list of [key, value]"),  # every entry's shape is checked first
        ([["k y", "v"]], "not a text metadata key"),
        ([["", "v"]], "not a text metadata key"),
        ([["abc\n", "v"]], "not a text metadata key"),
        ([["blob-bin", "AAAA"]], "not a text metadata key"),
        ([["\u212aey", "v"]], "not a text metadata key"),  # the Kelvin sign lowers to "k": gRPC refuses it too
        ([["ok", "a\tb"]], "not printable ASCII"),
        ([["ok", "\x7f"]], "not printable ASCII"),
        ([["ok", "\u00e9"]], "not printable ASCII"),
    ],
)
def test_what_grpc_would_not_take_is_refused(value: Any, says: str) -> None:
    with pytest.raises(FrameError, match=re.escape(says)) as err:
        _metadata(value)
    assert err.value.code.name == "INVALID_ARGUMENT"
