"""Client helpers: channels; a token, request id and deadline on every call; retries of idempotent calls only."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor_pb2 import MethodOptions

from ff_rpc.acting import ACT_AS_HEADER, current_acting
from ff_rpc.auth import AUTHORIZATION_HEADER, BEARER_PREFIX
from ff_rpc.errors import RpcError
from ff_rpc.interceptor import REQUEST_ID_HEADER
from ff_rpc.logs import current_log_fields

logger = logging.getLogger(__name__)

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    # A restarted or failed-over server is retried within 100 ms-2 s, not grpc's default 1-120 s, and
    # a channel does not inherit another channel's connection backoff to the same address.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.use_local_subchannel_pool", 1),
]
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_SAFE_LEVELS = {MethodOptions.IDEMPOTENT, MethodOptions.NO_SIDE_EFFECTS}


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with full jitter, for idempotent calls on UNAVAILABLE/DEADLINE_EXCEEDED."""

    max_attempts: int = 4
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    multiplier: float = 2.0

    def backoff_s(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Sleep before retry number ``attempt`` (1-based): uniform in [0, min(max, initial*mult^(n-1))]."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        return cap * rand()


NO_RETRY = RetryPolicy(max_attempts=1)


def open_channel(target: str) -> grpc.aio.Channel:
    """A plaintext channel to ``target`` (``host:port``) with the cluster's options: 64 MiB messages, fast reconnect."""
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


StubT = TypeVar("StubT")


class StubPool(Generic[StubT]):
    """One channel (and its stub) per address, reused by every call to it, closed together."""

    def __init__(self, factory: Callable[[grpc.aio.Channel], StubT]) -> None:
        self._factory = factory
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, StubT] = {}

    def get(self, address: str) -> StubT:
        """The stub for ``address``, its channel opened on first use."""
        if address not in self._stubs:
            self._channels[address] = open_channel(address)
            self._stubs[address] = self._factory(self._channels[address])
        return self._stubs[address]

    async def close(self) -> None:
        """Closes every channel (in-flight calls on them fail); a later ``get`` opens a new one."""
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            await channel.close()


async def call_once(
    address: str,
    factory: Callable[[grpc.aio.Channel], StubT],
    select: Callable[[StubT], Any],
    request: Any,
    *,
    token: str,
    timeout_s: float = 5.0,
) -> Any:
    """One call on a channel opened for it: for tools that talk to a service once (services keep a pool).

    Raises:
        RpcError: the call's status, as RpcClient.unary.
    """
    async with open_channel(address) as channel:
        return await RpcClient(token=token, timeout_s=timeout_s).unary(select(factory(channel)), request)


def method_path(multicallable: Any) -> str:
    """``/pkg.Service/Method`` of a stub attribute (grpc keeps it on the multicallable)."""
    path = getattr(multicallable, "_method", b"")
    return path.decode() if isinstance(path, bytes) else str(path)


def is_idempotent(full_method: str) -> bool:
    """Whether the proto declares the method IDEMPOTENT or NO_SIDE_EFFECTS (safe to retry)."""
    service, _, method = full_method.lstrip("/").partition("/")
    try:
        desc = descriptor_pool.Default().FindMethodByName(f"{service}.{method}")
    except KeyError:
        return False
    return desc.GetOptions().idempotency_level in _SAFE_LEVELS


class RpcClient:
    """Calls through one stub with the caller's token, a deadline and the retry policy."""

    def __init__(
        self,
        *,
        token: str | Callable[[], str],
        timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._token = token
        self._timeout_s = timeout_s
        self._retry = retry or RetryPolicy()

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries: request id (this context's, else a new one), bearer token, ``ff-act-as``.

        For a caller that drives a stub itself (a bidirectional stream) instead of ``unary`` or ``stream``.
        """
        token = self._token() if callable(self._token) else self._token
        rid = current_log_fields().get("request_id") or uuid.uuid4().hex[:16]
        md: tuple[tuple[str, str], ...] = ((REQUEST_ID_HEADER, str(rid)),)
        if token:
            md += ((AUTHORIZATION_HEADER, BEARER_PREFIX + token),)
        acting = current_acting()
        if acting is not None:
            md += ((ACT_AS_HEADER, acting.header()),)
        return md

    async def unary(
        self,
        call: Callable[..., Any],
        request: RequestT,
        *,
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        """One unary call; retried only when the proto marks the method idempotent.

        Raises:
            RpcError: the final status, with code, details and trailing metadata.
        """
        policy = retry or self._retry
        if not is_idempotent(method_path(call)):
            policy = NO_RETRY
        attempt = 1
        while True:
            try:
                return await call(request, timeout=timeout_s or self._timeout_s, metadata=self.metadata())
            except grpc.aio.AioRpcError as err:
                if err.code() not in RETRYABLE_CODES or attempt >= policy.max_attempts:
                    raise RpcError.from_grpc(err) from None
                delay = policy.backoff_s(attempt)
                logger.debug("retrying %s after %s (%.3fs)", method_path(call), err.code().name, delay)
                attempt += 1
                await asyncio.sleep(delay)

    async def stream(
        self, call: Callable[..., Any], request: RequestT, *, timeout_s: float | None = None
    ) -> AsyncIterator[Any]:
        """A server stream; ``timeout_s`` None means no deadline (the caller cancels it)."""
        stream = call(request, timeout=timeout_s, metadata=self.metadata())
        try:
            async for item in stream:
                yield item
        except grpc.aio.AioRpcError as err:
            raise RpcError.from_grpc(err) from None
        finally:
            stream.cancel()
