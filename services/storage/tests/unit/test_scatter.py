"""The node's copy of a staged transfer into a client's shared-memory places."""

from __future__ import annotations

from ff_storage.dataserver import scatter


def test_parts_fill_places_across_boundaries() -> None:
    parts = [b"abc", memoryview(b"defgh"), b"", b"ij"]
    dests = [memoryview(bytearray(n)) for n in (4, 0, 1, 5)]
    scatter(parts, dests)
    assert b"".join(bytes(d) for d in dests) == b"abcdefghij"
    assert [bytes(d) for d in dests] == [b"abcd", b"", b"e", b"fghij"]
