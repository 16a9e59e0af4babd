"""Who is looking at the dashboard: a token in a cookie (set at login), or a bearer header (scripts).

The cookie is HttpOnly and SameSite=Strict; every page and API route asks ``Sessions.caller``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from ff_rpc import Principal
from ff_rpc.auth import BEARER_PREFIX

COOKIE_NAME = "ff_dashboard_token"
COOKIE_MAX_AGE_S = 12 * 3600
MAX_TOKEN_CHARS = 256

Authenticate = Callable[[str], Awaitable[Principal]]


@dataclass(frozen=True)
class Caller:
    """The logged-in user and the token the dashboard calls the scheduler and mgmtd with on their behalf."""

    principal: Principal
    token: str


class Sessions:
    """Login (validate a token, set the cookie), logout, and the caller of a request."""

    def __init__(self, authenticate: Authenticate) -> None:
        self._authenticate = authenticate

    async def login(self, token: str) -> Caller:
        """The caller a pasted token stands for.

        Raises:
            HTTPUnauthorized: the token is not valid.
            HTTPServiceUnavailable: mgmtd cannot say.
        """
        token = token.strip()
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise web.HTTPUnauthorized(text="paste a token\n")
        return Caller(await self._authenticate(token), token)

    async def caller(self, request: web.Request) -> Caller | None:
        """The request's caller, or None without a token; HTTPUnauthorized for an invalid token."""
        header = request.headers.get("Authorization", "")
        token = header[len(BEARER_PREFIX) :] if header.startswith(BEARER_PREFIX) else request.cookies.get(COOKIE_NAME)
        if not token:
            return None
        return await self.login(token)

    @staticmethod
    def remember(response: web.StreamResponse, request: web.Request, caller: Caller) -> None:
        """Set the session cookie of ``caller`` on ``response`` (Secure when the request came over HTTPS)."""
        # JS never reads the token (HttpOnly); no other site's page can send it (Strict).
        response.set_cookie(
            COOKIE_NAME,
            caller.token,
            max_age=COOKIE_MAX_AGE_S,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )

    @staticmethod
    def forget(response: web.StreamResponse) -> None:
        """Delete the session cookie."""
        response.del_cookie(COOKIE_NAME, path="/")
