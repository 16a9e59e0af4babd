"""The server interceptor every service runs: request ids, authentication, authorization by the proto's access option.

It also refuses malformed request bytes as INVALID_ARGUMENT, answers each error with the one status code the
service's table gives it, counts the RPC metrics and writes an access log.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from ff_rpc.acting import ACT_AS_HEADER, acting_principal
from ff_rpc.auth import (
    CLUSTER_PRINCIPAL,
    Access,
    Principal,
    TokenValidator,
    authorize,
    bearer_token,
    is_cluster_token,
    method_access,
    set_current_principal,
)
from ff_rpc.errors import InvalidArgument, StatusTable, Unauthenticated
from ff_rpc.logs import set_log_fields
from ff_rpc.metrics import MethodMeters, RpcMetrics

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"

# Request ids made here: this process's random prefix and a count, 16 hex digits (uuid4 per call cost more).
_REQUEST_ID_PREFIX = os.urandom(4).hex()
_request_serial = itertools.count(1)


def new_request_id() -> str:
    """A request id for a call that came without one (unique across processes by its random prefix)."""
    return f"{_REQUEST_ID_PREFIX}{next(_request_serial) & 0xFFFFFFFF:08x}"


if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]
Behavior = Callable[..., Any]
Deserializer = Callable[[bytes], Any]


class MalformedRequest:
    """What a request that could not be parsed becomes, so the call can refuse it as INVALID_ARGUMENT.

    grpc answers an exception raised by a request deserializer with UNKNOWN before any handler or
    interceptor code runs; the interceptor therefore wraps each deserializer to return this instead.
    """

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def error(self) -> InvalidArgument:
        """The error the call is refused with, naming what the parser said."""
        return InvalidArgument(f"malformed request message: {self.reason}")


def lenient_deserializer(deserialize: Deserializer | None) -> Deserializer | None:
    """``deserialize`` that returns a MalformedRequest where it would raise (None stays None: raw bytes)."""
    if deserialize is None:
        return None
    strict = deserialize

    def parse(data: bytes) -> Any:
        try:
            return strict(data)
        except Exception as exc:  # DecodeError, and anything a custom deserializer raises on bad bytes
            return MalformedRequest(str(exc) or type(exc).__name__)

    return parse


class ServicePolicyInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler of the server with the service policy (see module docstring)."""

    def __init__(
        self,
        *,
        cluster_token: str,
        validator: TokenValidator | None,
        status_table: StatusTable,
        metrics: RpcMetrics,
    ) -> None:
        self._cluster_token = cluster_token
        self._validator = validator
        self._status_table = status_table
        self._metrics = metrics
        # Per method: the handler grpc gave and its wrapped form (the same every call: built once).
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        """The method's handler wrapped in the policy (grpc calls it once per call); None for an unknown method.

        The wrapped handler is made once per method and kept while grpc gives the same handler for it.
        """
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: Handler) -> Handler:
        access = method_access(method)
        deserialize = lenient_deserializer(handler.request_deserializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, access, handler.unary_unary, streamed=False),
                deserialize,
                handler.response_serializer,
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(method, access, handler.stream_unary, streamed=True),
                deserialize,
                handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, access, handler.unary_stream, streamed=False),
                deserialize,
                handler.response_serializer,
            )
        assert handler.stream_stream is not None  # grpc sets exactly one of the four
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_stream(method, access, handler.stream_stream, streamed=True),
            deserialize,
            handler.response_serializer,
        )

    def _wrap_unary(self, method: str, access: Access | None, inner: Behavior, *, streamed: bool) -> Behavior:
        meters = self._metrics.of_method(method)

        async def behavior(request: Any, context: Context) -> Any:
            async with _Call(self, method, access, context, meters) as call:
                await call.authenticate()
                request = await call.checked_request(request, streamed=streamed)
                return await call.guard(inner(request, context))

        return behavior

    def _wrap_stream(self, method: str, access: Access | None, inner: Behavior, *, streamed: bool) -> Behavior:
        meters = self._metrics.of_method(method)

        async def behavior(request: Any, context: Context) -> AsyncIterator[Any]:
            async with _Call(self, method, access, context, meters) as call:
                await call.authenticate()
                request = await call.checked_request(request, streamed=streamed)
                stream = inner(request, context)
                while True:
                    try:
                        item = await call.guard(anext(stream))
                    except StopAsyncIteration:
                        return
                    yield item

        return behavior

    async def authenticate(
        self, access: Access | None, context: Context, metadata: tuple[tuple[str, str | bytes], ...] | None = None
    ) -> Principal | None:
        """The caller of a method declared with ``access``, authorized; None for an open or tokenless public call.

        The cluster token is checked here; any other token goes to the validator. An ``ff-act-as`` header
        turns an admin's call into one made as that identity.

        Raises:
            Unauthenticated: no token where one is needed, or the token is not accepted.
            PermissionDenied: the caller may not call this method, or act as another user.
            InvalidArgument: a malformed ``ff-act-as`` header.
        """
        if access is None:
            return None
        if metadata is None:
            metadata = tuple(context.invocation_metadata() or ())
        token = bearer_token(metadata)
        if access is Access.PUBLIC and not token:
            return None
        if not token:
            raise Unauthenticated("missing bearer token (metadata 'authorization: Bearer <token>')")
        if is_cluster_token(token, self._cluster_token):
            principal = CLUSTER_PRINCIPAL
        elif self._validator is None:
            raise Unauthenticated("this service accepts only the cluster token")
        else:
            principal = await self._validator.validate(token)
        act_as = next((v for k, v in metadata if k == ACT_AS_HEADER), None)
        if act_as is not None:
            principal = acting_principal(principal, act_as if isinstance(act_as, str) else act_as.decode())
        authorize(access, principal)
        return principal

    def status_for(self, exc: BaseException) -> grpc.StatusCode | None:
        """The status the service's table gives ``exc``; None for an unexpected error (answered INTERNAL)."""
        return self._status_table.code_for(exc)

    @property
    def metrics(self) -> RpcMetrics:
        """The server's RPC counters and histograms, which each call updates."""
        return self._metrics


class _Call:
    """One RPC being served: its request id, principal, status, timing."""

    def __init__(
        self,
        policy: ServicePolicyInterceptor,
        method: str,
        access: Access | None,
        context: Context,
        meters: MethodMeters,
    ) -> None:
        self._policy = policy
        self._method = method
        self._access = access
        self._context = context
        self._meters = meters
        self.code = grpc.StatusCode.OK
        self._metadata: tuple[tuple[str, str | bytes], ...] = tuple(context.invocation_metadata() or ())
        rid = next((v for k, v in self._metadata if k == REQUEST_ID_HEADER), None) or new_request_id()
        self.request_id = rid if isinstance(rid, str) else rid.decode()

    async def __aenter__(self) -> _Call:
        self._start = time.perf_counter()
        # grpc.aio serves each call in its own task (own context), so the ids need no reset afterwards.
        set_log_fields(request_id=self.request_id, rpc=self._method)
        self._meters.in_flight.inc()
        return self

    async def authenticate(self) -> None:
        principal = await self.guard(self._policy.authenticate(self._access, self._context, self._metadata))
        set_current_principal(principal)

    async def checked_request(self, request: Any, *, streamed: bool) -> Any:
        """The request, refused as INVALID_ARGUMENT when it is malformed.

        A request stream is checked as each message arrives (see ``_checked_messages``).
        """
        if streamed:
            return self._checked_messages(request)
        if isinstance(request, MalformedRequest):
            await self.guard(_raise(request.error()))
        return request

    async def _checked_messages(self, messages: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The messages of a request stream; a malformed one ends the call with INVALID_ARGUMENT.

        The status is sent from here at once (``context.abort``), so the answer does not depend on what
        the servicer does with the error raised into its loop (it may read the stream in another task).
        """
        async for message in messages:
            if isinstance(message, MalformedRequest):
                self.code = grpc.StatusCode.INVALID_ARGUMENT
                await self._context.abort(
                    self.code, str(message.error()), trailing_metadata=((REQUEST_ID_HEADER, self.request_id),)
                )
            yield message

    async def __aexit__(self, *exc_info: object) -> None:
        exc = exc_info[1]
        if isinstance(exc, BaseException) and self.code is grpc.StatusCode.OK:
            self.code = grpc.StatusCode.CANCELLED
        duration_s = time.perf_counter() - self._start
        self._meters.in_flight.dec()
        self._meters.observe(self.code.name, duration_s)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("rpc done", extra={"code": self.code.name, "duration_ms": round(duration_s * 1e3, 3)})
        set_current_principal(None)

    async def guard(self, awaitable: Awaitable[Any]) -> Any:
        """Await ``awaitable``; turn any exception into the one status code the table gives it."""
        try:
            return await awaitable
        except grpc.aio.AbortError:
            self.code = _status_of(self._context)
            raise
        except (StopAsyncIteration, GeneratorExit):
            raise
        except Exception as exc:
            code = self._policy.status_for(exc)
            if code is None:
                logger.exception("internal error in %s", self._method)
                code, details = grpc.StatusCode.INTERNAL, f"internal error (request id {self.request_id})"
            else:
                details = bounded_details(str(exc) or type(exc).__name__)
            self.code = code
            extra = getattr(exc, "trailing_metadata", None)
            trailing = tuple(extra()) if callable(extra) else ()
            trailing += ((REQUEST_ID_HEADER, self.request_id),)
            await self._context.abort(code, details, trailing_metadata=trailing)
            raise AssertionError("unreachable: abort raises") from exc


MAX_DETAILS_CHARS = 1024


def bounded_details(text: str) -> str:
    """An error's details cut to MAX_DETAILS_CHARS.

    A message that quotes a caller's huge field would otherwise go back whole in a header (clients refuse headers
    over 16 KiB, and get no status at all).
    """
    if len(text) <= MAX_DETAILS_CHARS:
        return text
    return f"{text[:MAX_DETAILS_CHARS]}... ({len(text) - MAX_DETAILS_CHARS} more characters)"


async def _raise(exc: Exception) -> None:
    raise exc


def _status_of(context: Context) -> grpc.StatusCode:
    """The status a servicer set with context.abort (grpc's typing says code() always returns one)."""
    code: grpc.StatusCode | None = context.code()
    return code if code is not None else grpc.StatusCode.UNKNOWN
