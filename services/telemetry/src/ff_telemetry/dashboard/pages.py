"""The dashboard's HTML pages and its login and logout.

A page is a static shell (``static/<page>.html``) with the user's name put in, html-escaped; its script fills
it from the JSON API with ``textContent`` only.
"""

from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from ff_telemetry.dashboard import params
from ff_telemetry.dashboard.cluster import ClusterReader
from ff_telemetry.dashboard.guard import Guard, Handler
from ff_telemetry.dashboard.session import Caller, Sessions

STATIC = Path(__file__).parent / "static"
PAGES = ("overview", "tasks", "task", "storage", "alerts", "login")


def safe_next(raw: str | None) -> str:
    """Where to go after login: a path on this site only (no scheme, no host, no //host)."""
    if not raw or not raw.startswith("/") or raw.startswith("//") or "\\" in raw:
        return "/"
    parts = urlsplit(raw)
    return raw if not parts.scheme and not parts.netloc else "/"


class DashboardPages:
    """The HTML routes: the pages (behind the guard, else to the login page), login and logout."""

    def __init__(self, sessions: Sessions, reader: ClusterReader) -> None:
        self._sessions = sessions
        self._reader = reader
        self._templates = {name: (STATIC / f"{name}.html").read_text() for name in PAGES}

    def install(self, app: web.Application, guard: Guard) -> None:
        """Add the page, login and logout routes to ``app``."""
        r = app.router
        r.add_get("/", guard.page(self._page("overview")))
        r.add_get("/tasks", guard.page(self._page("tasks")))
        r.add_get("/tasks/{task_id}", guard.page(self.task))
        r.add_get("/storage", guard.page(self._page("storage")))
        r.add_get("/alerts", guard.page(self._page("alerts")))
        r.add_get("/login", self.login_form)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_static("/static/", STATIC, append_version=False)

    def render(self, name: str, *, user: str = "", message: str = "", status: int = 200) -> web.Response:
        """Page ``name`` with the user's name and a message put in, html-escaped."""
        text = self._templates[name].replace("{{user}}", html.escape(user)).replace("{{message}}", html.escape(message))
        return web.Response(text=text, content_type="text/html", status=status)

    def _page(self, name: str) -> Handler:
        async def page(request: web.Request, caller: Caller) -> web.Response:
            return self.render(name, user=caller.principal.name)

        return page

    async def task(self, request: web.Request, caller: Caller) -> web.Response:
        """A task's page: 404 (from the scheduler, asked with the caller's token) if the caller may not see it."""
        try:
            task_id = params.task_id(request)
        except web.HTTPBadRequest:
            raise web.HTTPNotFound(text="no such task\n") from None
        await self._reader.as_user(caller.token).task(task_id)
        return self.render("task", user=caller.principal.name)

    async def login_form(self, request: web.Request) -> web.Response:
        """``GET /login``: the form to paste a token into."""
        return self.render("login")

    async def login(self, request: web.Request) -> web.Response:
        """``POST /login``: check the token, set the session cookie and go back to ``next`` (this site only)."""
        form = await request.post()
        token = form.get("token")
        try:
            caller = await self._sessions.login(token if isinstance(token, str) else "")
        except web.HTTPUnauthorized as exc:
            return self.render("login", message=f"Not logged in: {(exc.text or '').strip()}", status=401)
        response = web.Response(status=303, headers={"Location": safe_next(request.query.get("next"))})
        self._sessions.remember(response, request, caller)
        return response

    async def logout(self, request: web.Request) -> web.Response:
        """``POST /logout``: drop the session cookie and go to the login page."""
        response = web.Response(status=303, headers={"Location": "/login"})
        self._sessions.forget(response)
        return response
