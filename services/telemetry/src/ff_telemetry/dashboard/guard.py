"""What every dashboard route goes through: the caller's session, and one table from errors to HTTP statuses.

Without a session pages redirect to the login page and the API answers 401; the table maps the errors of
the services and the store to HTTP statuses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import quote

import grpc
from aiohttp import web

from ff_rpc import RpcError
from ff_telemetry.core.errors import InvalidRequest, LimitExceeded
from ff_telemetry.dashboard.cluster import NoScheduler
from ff_telemetry.dashboard.params import json_error
from ff_telemetry.dashboard.session import Caller, Sessions

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request, Caller], Awaitable[web.StreamResponse]]
Route = Callable[[web.Request], Awaitable[web.StreamResponse]]

# What the scheduler's or mgmtd's answer to the user's call becomes.
HTTP_STATUS_OF_RPC: dict[grpc.StatusCode, type[web.HTTPError]] = {
    grpc.StatusCode.NOT_FOUND: web.HTTPNotFound,
    grpc.StatusCode.PERMISSION_DENIED: web.HTTPForbidden,
    grpc.StatusCode.UNAUTHENTICATED: web.HTTPUnauthorized,
    grpc.StatusCode.INVALID_ARGUMENT: web.HTTPBadRequest,
    grpc.StatusCode.FAILED_PRECONDITION: web.HTTPConflict,
    grpc.StatusCode.UNAVAILABLE: web.HTTPServiceUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: web.HTTPGatewayTimeout,
}
SECURITY_HEADERS = {
    # No inline script or style, nothing from another origin: a string that slipped through unescaped
    # still could not run.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

dumps = partial(json.dumps, allow_nan=False)


def json_response(data: Any) -> web.Response:
    """``data`` as a strict JSON response: a NaN or infinity raises ValueError (``series.finite`` nulls them)."""
    return web.json_response(data, dumps=dumps)


def http_error(exc: Exception) -> web.HTTPError:
    """The HTTP answer to a domain or RPC error (a JSON body ``{"error": ...}``)."""
    if isinstance(exc, RpcError):
        return json_error(HTTP_STATUS_OF_RPC.get(exc.code, web.HTTPBadGateway), exc.details or exc.code.name)
    if isinstance(exc, NoScheduler):
        return json_error(web.HTTPServiceUnavailable, str(exc))
    return json_error(web.HTTPBadRequest, str(exc))


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Add the ``SECURITY_HEADERS`` a handler did not set itself (an on_response_prepare hook)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


class Guard:
    """Wraps route handlers: the caller from their session or bearer token, errors mapped to HTTP answers."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    def api(self, handler: Handler) -> Route:
        """A JSON route: 401 without a valid session or bearer token."""

        async def route(request: web.Request) -> web.StreamResponse:
            try:
                caller = await self.sessions.caller(request)
            except web.HTTPUnauthorized as exc:
                raise json_error(web.HTTPUnauthorized, exc.text or "invalid token") from None
            if caller is None:
                raise json_error(web.HTTPUnauthorized, "log in first (or send Authorization: Bearer <token>)")
            try:
                return await handler(request, caller)
            except (RpcError, NoScheduler, InvalidRequest, LimitExceeded) as exc:
                raise http_error(exc) from None

        return route

    def page(self, handler: Handler) -> Route:
        """An HTML route: to the login page (and back here after it) without a valid session."""

        async def route(request: web.Request) -> web.StreamResponse:
            try:
                caller = await self.sessions.caller(request)
            except web.HTTPUnauthorized:
                caller = None
            if caller is None:
                raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}")
            try:
                return await handler(request, caller)
            except (RpcError, NoScheduler) as exc:
                err = http_error(exc)
                raise type(err)(text=f"{err.status} {err.reason}\n") from None

        return route
