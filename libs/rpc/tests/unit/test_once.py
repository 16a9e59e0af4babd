"""Calls done once (``ff_rpc.once``): every attempt of one call carries the same key, and such a call is retried
after a lost connection as an idempotent one is; other calls carry no key and are not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2

from ff_rpc import RetryPolicy, RpcClient, RpcError
from ff_rpc.client import ChannelInvoker, ChannelPool
from ff_rpc.errors import InvalidArgument
from ff_rpc.once import ONCE_HEADER, once_value
from fireflyer.rpc_types import Method

RENAME = Method("/t.S/Rename", empty_pb2.Empty, empty_pb2.Empty, idempotent=False)
CREATE = Method("/t.S/Create", empty_pb2.Empty, empty_pb2.Empty, idempotent=False)
LOST = "Connection reset by peer"  # an UNAVAILABLE after the request went out: the server may have run it


async def _attempts(
    method: Method[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
    once: frozenset[str] | Callable[[], frozenset[str]] = frozenset({RENAME.path}),
) -> tuple[list[str | None], Any]:
    """Send ``method`` through an invoker whose first attempt loses its connection: each attempt's key, the outcome."""
    rpc = RpcClient(token="t", retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.001))
    keys: list[str | None] = []

    async def send(call: Any, request: Any, *, timeout_s: float | None = None) -> Any:
        keys.append(dict(rpc.metadata()).get(ONCE_HEADER))
        if len(keys) == 1:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, LOST)
        return empty_pb2.Empty()

    monkeypatch.setattr(rpc, "send", send)
    channels = ChannelPool()
    invoker = ChannelInvoker(rpc, channels, "127.0.0.1:1", once=once)
    try:
        outcome: Any = await invoker.unary(method, empty_pb2.Empty(), timeout_s=1.0)
    except RpcError as err:
        outcome = err.code
    finally:
        await channels.close()
    return keys, outcome


async def test_a_call_done_once_is_retried_with_the_same_key(monkeypatch: pytest.MonkeyPatch) -> None:
    keys, outcome = await _attempts(RENAME, monkeypatch)
    assert outcome == empty_pb2.Empty()
    assert len(keys) == 2 and keys[0] is not None and keys[0] == keys[1]
    again, _ = await _attempts(RENAME, monkeypatch)
    assert again[0] != keys[0], "two calls shared a key"


async def test_another_non_idempotent_call_carries_no_key_and_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    keys, outcome = await _attempts(CREATE, monkeypatch)
    assert outcome == grpc.StatusCode.UNAVAILABLE
    assert keys == [None]


async def test_the_methods_done_once_are_asked_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client whose service instances do not all record keys (an older one among them) sends no key, no retry."""
    everywhere = [False]
    once = lambda: frozenset({RENAME.path}) if everywhere[0] else frozenset()  # noqa: E731
    keys, outcome = await _attempts(RENAME, monkeypatch, once)
    assert outcome == grpc.StatusCode.UNAVAILABLE
    assert keys == [None]
    everywhere[0] = True
    keys, outcome = await _attempts(RENAME, monkeypatch, once)
    assert outcome == empty_pb2.Empty()
    assert len(keys) == 2 and keys[0] is not None and keys[0] == keys[1]


@pytest.mark.parametrize("bad", ["short", "x" * 65, "0123456789abcdef-", "0123456789abcdéf"])
def test_a_malformed_key_is_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        once_value([(ONCE_HEADER, bad)])
    assert once_value([("other", "v")]) is None
    assert once_value([(ONCE_HEADER, "0123456789abcdef")]) == "0123456789abcdef"
