"""The collector's HTTP side (aiohttp): /federate (the Prometheus exposition of what it holds) and /healthz.

Bearer tokens as on gRPC; a user sees the cluster's series and their own.
"""

from __future__ import annotations

import logging

from aiohttp import web

from ff_rpc import Principal, TokenValidator, Unauthenticated, Unavailable
from ff_rpc.auth import BEARER_PREFIX, CLUSTER_PRINCIPAL, is_cluster_token
from ff_telemetry.core.exposition import CONTENT_TYPE, ExposedSample, render
from ff_telemetry.core.validation import USER_LABEL
from ff_telemetry.store.api import TelemetryStore

logger = logging.getLogger(__name__)


class WebServer:
    """An aiohttp server on its own port; other routes (the dashboard) may be added to ``app``."""

    def __init__(
        self, store: TelemetryStore, cluster_token: str, validator: TokenValidator | None, max_age_s: float
    ) -> None:
        self._store = store
        self._cluster_token = cluster_token
        self._validator = validator
        self._max_age_s = max_age_s
        self.app = web.Application()
        self.app.router.add_get("/federate", self._federate)
        self.app.router.add_get("/healthz", self._healthz)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, address: str) -> None:
        """Listen on ``address`` (``host:port``, port 0: any); the bound port is ``port`` afterwards."""
        host, port = address.rsplit(":", 1)
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, int(port))
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        logger.info("http serving", extra={"address": f"{host}:{self.port}"})

    async def stop(self) -> None:
        """Stop listening and close the connections (idempotent)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def principal(self, request: web.Request) -> Principal:
        """The caller of an HTTP request (401 without a valid bearer token)."""
        header = request.headers.get("Authorization", "")
        if not header.startswith(BEARER_PREFIX):
            raise web.HTTPUnauthorized(text="an 'Authorization: Bearer <token>' header is required\n")
        return await self.authenticate(header[len(BEARER_PREFIX) :].strip())

    async def authenticate(self, token: str) -> Principal:
        """The owner of ``token`` (401 for an unknown or malformed one)."""
        if is_cluster_token(token, self._cluster_token):
            return CLUSTER_PRINCIPAL
        if self._validator is None:
            raise web.HTTPUnauthorized(text="unknown token\n")
        try:
            return await self._validator.validate(token)
        except Unauthenticated as exc:
            raise web.HTTPUnauthorized(text=f"{exc}\n") from None
        except Unavailable as exc:
            raise web.HTTPServiceUnavailable(text=f"{exc}\n") from None

    async def _federate(self, request: web.Request) -> web.Response:
        caller = await self.principal(request)
        latest, metadata = await self._store.alatest(self._max_age_s)
        user = None if caller.is_admin else caller.name
        visible = [
            ExposedSample(s.name, s.labels, s.value, s.at)
            for s in latest
            if user is None or dict(s.labels).get(USER_LABEL, "") in ("", user)
        ]
        return web.Response(body=render(visible, metadata).encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")
