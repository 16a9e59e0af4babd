"""Calls a service does once: one key on every attempt of a call, so that a retry answers the first attempt's result.

A mutating call that is not idempotent (a Rename, a Remove) cannot be sent again after its connection was lost
mid-call: it may have run. A service that records such calls' results under a key the client picks (meta: its
``store/once.py``) makes sending it again safe, as long as every attempt carries the same key. The client sets the
key for the call (``sending_once``) and its attempts' metadata carry it (``ONCE_HEADER``); the server reads it
back with ``once_value``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Sequence

from ff_rpc.errors import InvalidArgument

ONCE_HEADER = "ff-once"
# A key's length: 32 hex digits from the client (16 random bytes); the server takes 16 to 64 letters or digits.
MIN_LEN, MAX_LEN = 16, 64

_once: contextvars.ContextVar[str | None] = contextvars.ContextVar("ff_once", default=None)


@contextlib.contextmanager
def sending_once() -> Iterator[str]:
    """Within it, the calls' metadata carry one new key (every attempt of one call made within it)."""
    token = _once.set(os.urandom(16).hex())
    try:
        yield _once.get() or ""
    finally:
        _once.reset(token)


def once_metadata() -> tuple[tuple[str, str], ...]:
    """The key's header for the call being made, or nothing outside ``sending_once``."""
    key = _once.get()
    return () if key is None else ((ONCE_HEADER, key),)


def once_value(metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
    """The call's key from its metadata; None when it has none.

    Raises:
        InvalidArgument: a key that is not 16 to 64 ASCII letters or digits.
    """
    value = next((v for k, v in metadata if k == ONCE_HEADER), None)
    if value is None:
        return None
    text = value if isinstance(value, str) else value.decode("ascii", errors="replace")
    if not (MIN_LEN <= len(text) <= MAX_LEN and text.isascii() and text.isalnum()):
        raise InvalidArgument(f"metadata {ONCE_HEADER!r} must be {MIN_LEN} to {MAX_LEN} ASCII letters or digits")
    return text
