"""Client helpers: channels; a token, request id and deadline on every call; retries of idempotent calls only."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, nullcontext
from typing import Any, Generic, Protocol, TypeVar

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor_pb2 import MethodOptions
from google.protobuf.message import DecodeError, Message

from ff_rpc.acting import ACT_AS_HEADER, current_acting
from ff_rpc.auth import AUTHORIZATION_HEADER, BEARER_PREFIX
from ff_rpc.errors import RpcError
from ff_rpc.fastpath import FastPool
from ff_rpc.interceptor import REQUEST_ID_HEADER, new_request_id
from ff_rpc.logs import current_request_id
from ff_rpc.once import once_metadata, sending_once
from ff_rpc.retry import NO_RETRY, RETRYABLE_CODES, RetryPolicy, Router, never_reached_a_server, retry_call
from fireflyer.rpc_types import Invoker, Method

logger = logging.getLogger(__name__)

# A fast endpoint that could not be reached is not tried again for this long (its calls go over gRPC).
FAST_RETRY_AFTER_S = 30.0

RequestT = TypeVar("RequestT", bound=Message)
ResponseT = TypeVar("ResponseT", bound=Message)
ClientT = TypeVar("ClientT")
ResultT = TypeVar("ResultT")
RequestT_contra = TypeVar("RequestT_contra", contravariant=True)
ResponseT_co = TypeVar("ResponseT_co", covariant=True)

__all__ = [
    "NO_RETRY",
    "RETRYABLE_CODES",
    "ChannelInvoker",
    "ChannelPool",
    "ClientPool",
    "RetryPolicy",
    "Route",
    "RpcClient",
    "UnaryCall",
    "connect",
    "is_idempotent",
    "method_path",
    "one_call",
    "open_channel",
]

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
_SAFE_LEVELS = {MethodOptions.IDEMPOTENT, MethodOptions.NO_SIDE_EFFECTS}


def open_channel(target: str) -> grpc.aio.Channel:
    """A plaintext channel to ``target`` (``host:port``) with the cluster's options: 64 MiB messages, fast reconnect."""
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


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
        # A fixed token's header, made once (a callable's is made per call: the token may change).
        self._auth = _auth_metadata(token) if isinstance(token, str) else None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries: request id (this context's, else a new one), bearer token, ``ff-act-as``.

        For a caller that drives a stub itself (a bidirectional stream) instead of ``unary`` or ``stream``.
        """
        auth = self._auth
        if auth is None:
            auth = _auth_metadata(self._token() if callable(self._token) else self._token)
        md: tuple[tuple[str, str], ...] = (
            (REQUEST_ID_HEADER, current_request_id() or new_request_id()),
            *auth,
            *once_metadata(),
        )
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
        path = method_path(call)

        async def attempt() -> Any:
            return await self.send(call, request, timeout_s=timeout_s)

        return await retry_call(attempt, policy=policy, idempotent=is_idempotent(path), name=path)

    async def send(self, call: Callable[..., Any], request: Any, *, timeout_s: float | None = None) -> Any:
        """One attempt of a unary call, without retries (the retry helper drives those).

        Raises:
            RpcError: the call's status, with code, details and trailing metadata.
        """
        try:
            return await call(request, timeout=timeout_s or self._timeout_s, metadata=self.metadata())
        except grpc.aio.AioRpcError as err:
            raise RpcError.from_grpc(err) from None

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of calls that do not name their own."""
        return self._retry

    @property
    def timeout_s(self) -> float:
        """The deadline of calls that do not name their own."""
        return self._timeout_s

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


def _auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((AUTHORIZATION_HEADER, BEARER_PREFIX + token),) if token else ()


class ChannelPool:
    """One channel per address, and per channel one callable per method, reused by every call, closed together."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._callables: dict[tuple[str, str], Any] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address``, opened on first use."""
        if address not in self._channels:
            self._channels[address] = open_channel(address)
        return self._channels[address]

    def multicallable(self, address: str, method: Method[RequestT, ResponseT]) -> Any:
        """The grpc multicallable of ``method`` on the channel to ``address`` (its call shape from the method)."""
        key = (address, method.path)
        if key not in self._callables:
            channel = self.channel(address)
            make = {
                (False, False): channel.unary_unary,
                (False, True): channel.unary_stream,
                (True, True): channel.stream_stream,
                (True, False): channel.stream_unary,
            }[(method.client_streaming, method.server_streaming)]
            self._callables[key] = make(
                method.path,
                request_serializer=method.request_type.SerializeToString,
                response_deserializer=method.response_type.FromString,
            )
        return self._callables[key]

    async def close(self) -> None:
        """Closes every channel (in-flight calls on them fail); a later call opens a new one."""
        channels = list(self._channels.values())
        self._channels.clear()
        self._callables.clear()
        for channel in channels:
            await channel.close()


class Route(Router, Protocol):
    """A moving destination (the mgmtd primary): where the next call goes, and where to go after a failure."""

    @property
    def current_address(self) -> str:
        """The address the next call goes to."""
        ...


class ChannelInvoker(Invoker):
    """Sends a typed client's calls (``fireflyer.rpc_types.Invoker``) to one address or wherever a ``Route`` points.

    Metadata and the default deadline come from the ``RpcClient``; unary calls retry through ``retry_call`` (a
    ``Route`` is its router), with ``retry`` or else the client's policy. The methods in ``once`` (full paths) are
    ones the service does once per key (``ff_rpc.once``): each call's attempts carry one key, and it is retried as an
    idempotent call is. ``once`` may be a callable, asked at each call: the methods done once where the calls go now
    (none while an instance that may get them does not record keys).
    """

    def __init__(
        self,
        rpc: RpcClient,
        channels: ChannelPool,
        route: str | Route,
        *,
        retry: RetryPolicy | None = None,
        unavailable_did_not_run: bool = False,
        fast: FastPool | None = None,
        fast_address: Callable[[str], str | None] | None = None,
        once: frozenset[str] | Callable[[], frozenset[str]] = frozenset(),
    ) -> None:
        self._rpc = rpc
        self._once = once
        self._channels = channels
        self._route = route
        self._retry = retry
        self._unavailable_did_not_run = unavailable_did_not_run
        self._fast = fast
        self._fast_address = fast_address
        self._fast_down: dict[str, float] = {}  # fast endpoints that could not be reached, until when

    def _address(self) -> str:
        return self._route if isinstance(self._route, str) else self._route.current_address

    async def unary(
        self, method: Method[RequestT, ResponseT], request: RequestT, *, timeout_s: float | None
    ) -> ResponseT:
        """One unary call, retried as ``retry_call`` allows.

        Raises:
            RpcError: the last attempt's status.
        """

        async def attempt() -> ResponseT:
            address = self._address()
            fast = self._fast_address(address) if self._fast is not None and self._fast_address is not None else None
            deadline_s = timeout_s or self._rpc.timeout_s
            if fast and self._fast_down.get(fast, 0.0) <= time.monotonic():
                started = time.monotonic()
                try:
                    return await self._fast_call(fast, method, request, deadline_s)
                except RpcError as err:  # not sent at all: gRPC may still reach the instance (a firewall, a proxy)
                    if not never_reached_a_server(err):
                        raise
                    self._fast_down[fast] = time.monotonic() + FAST_RETRY_AFTER_S
                deadline_s = max(0.001, deadline_s - (time.monotonic() - started))  # one deadline for both
            call = self._channels.multicallable(address, method)
            response: ResponseT = await self._rpc.send(call, request, timeout_s=deadline_s)
            return response

        router = None if isinstance(self._route, str) else self._route
        policy = self._retry or self._rpc.retry
        once = method.path in (self._once() if callable(self._once) else self._once)
        with sending_once() if once else nullcontext():
            return await retry_call(
                attempt,
                policy=policy,
                idempotent=method.idempotent or once,
                router=router,
                unavailable_did_not_run=self._unavailable_did_not_run,
                name=method.path,
            )

    async def _fast_call(
        self, address: str, method: Method[RequestT, ResponseT], request: RequestT, timeout_s: float | None
    ) -> ResponseT:
        """One attempt over the fast path (``ff_rpc.fastpath``), with the client's metadata and deadline."""
        assert self._fast is not None
        raw = await self._fast.call(address, method.path, request.SerializeToString(), self._rpc.metadata(), timeout_s)
        try:
            return method.response_type.FromString(raw)
        except DecodeError as exc:
            raise RpcError(grpc.StatusCode.INTERNAL, f"{method.path}: the answer does not parse: {exc}") from None

    def server_stream(
        self, method: Method[RequestT, ResponseT], request: RequestT, *, timeout_s: float | None
    ) -> AsyncIterator[ResponseT]:
        """A server stream from the current address; errors end it with ``RpcError`` (no retry)."""
        return self._rpc.stream(self._channels.multicallable(self._address(), method), request, timeout_s=timeout_s)

    def bidi_stream(
        self, method: Method[RequestT, ResponseT], requests: AsyncIterable[RequestT] | None, *, timeout_s: float | None
    ) -> grpc.aio.StreamStreamCall[RequestT, ResponseT]:
        """A bidirectional stream to the current address, with the client's metadata; grpc's call, as it is."""
        call = self._channels.multicallable(self._address(), method)
        stream: grpc.aio.StreamStreamCall[RequestT, ResponseT] = (
            call(metadata=self._rpc.metadata(), timeout=timeout_s)
            if requests is None
            else call(requests, metadata=self._rpc.metadata(), timeout=timeout_s)
        )
        return stream


class ClientPool(Generic[ClientT]):
    """Typed clients by address, over one channel pool: ``pool.get(address).batch_write(request)``."""

    def __init__(
        self, factory: Callable[[Invoker], ClientT], rpc: RpcClient, *, retry: RetryPolicy | None = None
    ) -> None:
        self._factory = factory
        self._rpc = rpc
        self._retry = retry
        self._channels = ChannelPool()
        self._clients: dict[str, ClientT] = {}

    def get(self, address: str) -> ClientT:
        """The client of ``address`` (its channel opened on first call)."""
        if address not in self._clients:
            self._clients[address] = self._factory(
                ChannelInvoker(self._rpc, self._channels, address, retry=self._retry)
            )
        return self._clients[address]

    async def close(self) -> None:
        """Closes the channels (in-flight calls on them fail); a later call opens a new one."""
        self._clients.clear()
        await self._channels.close()


@asynccontextmanager
async def connect(
    address: str, *, token: str | Callable[[], str], timeout_s: float = 5.0, retry: RetryPolicy | None = None
) -> AsyncIterator[ChannelInvoker]:
    """An invoker on a channel opened for the block: for tools that talk to a service once (services keep a pool).

    ``async with connect(address, token=t) as invoker: await StorageServiceClient(invoker).list_targets(request)``
    """
    channels = ChannelPool()
    try:
        yield ChannelInvoker(RpcClient(token=token, timeout_s=timeout_s, retry=retry), channels, address)
    finally:
        await channels.close()


async def one_call(
    address: str,
    factory: Callable[[Invoker], ClientT],
    call: Callable[[ClientT], Awaitable[ResultT]],
    *,
    token: str | Callable[[], str],
    timeout_s: float = 5.0,
) -> ResultT:
    """One typed call on a channel opened for it, for tools that talk to a service once (services keep a pool).

    ``await one_call(address, StorageServiceClient, lambda c: c.list_targets(request), token=token)``

    Raises:
        RpcError: the call's status.
    """
    async with connect(address, token=token, timeout_s=timeout_s) as invoker:
        return await call(factory(invoker))


class UnaryCall(Protocol[RequestT_contra, ResponseT_co]):
    """The shape of a generated client's unary method: ``client.stat`` as a value, for callers that pick one."""

    def __call__(self, request: RequestT_contra, *, timeout_s: float | None = None) -> Awaitable[ResponseT_co]:
        """Send ``request``; ``timeout_s`` None means the invoker's default deadline."""
        ...
