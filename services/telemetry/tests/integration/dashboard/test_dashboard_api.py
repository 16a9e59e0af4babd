"""The dashboard's pages, JSON API and login on a real cluster (mgmtd, scheduler, collector): who sees what,
what a bad or missing session gets, and what a malformed parameter gets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
import pytest_asyncio

from ff_testing.mgmtd import CLUSTER_TOKEN

from .conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

COOKIE = "ff_dashboard_token"
XSS = '<img src=x onerror="alert(1)">'


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def alice_task(cluster: Cluster) -> int:
    task_id = await cluster.submit("alice", XSS)
    await cluster.report("alice", task_id, (1, 2.5), (2, 1.75), (3, 1.0), (4, 1.25))
    return task_id


def as_user(cluster: Cluster, who: str) -> dict[str, str]:
    return {"Cookie": f"{COOKIE}={CLUSTER_TOKEN if who == 'cluster' else cluster.tokens[who]}"}


async def get(
    http: aiohttp.ClientSession, cluster: Cluster, path: str, who: str | None = None, **kw: Any
) -> tuple[int, Any, aiohttp.ClientResponse]:
    headers = as_user(cluster, who) if who else {}
    async with http.get(cluster.url + path, headers=headers, allow_redirects=False, **kw) as resp:
        body = await resp.json() if resp.content_type == "application/json" else await resp.text()
        return resp.status, body, resp


async def test_login_sets_a_strict_http_only_cookie(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    form = {"token": cluster.tokens["alice"]}
    async with http.post(f"{cluster.url}/login?next=/tasks", data=form, allow_redirects=False) as resp:
        assert resp.status == 303
        assert resp.headers["Location"] == "/tasks"
        cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}={cluster.tokens['alice']};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    # Somewhere else after login: only a path on this site.
    async with http.post(f"{cluster.url}/login?next=//evil.example/x", data=form, allow_redirects=False) as resp:
        assert resp.headers["Location"] == "/"
    async with http.post(f"{cluster.url}/logout", headers=as_user(cluster, "alice"), allow_redirects=False) as resp:
        assert resp.status == 303 and resp.headers["Location"] == "/login"
        assert f'{COOKIE}=""' in resp.headers["Set-Cookie"] or f"{COOKIE}=;" in resp.headers["Set-Cookie"]


async def test_a_bad_token_is_refused_at_login(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{cluster.url}/login", data={"token": "fft_0123456789abcdef_nope"}) as resp:
        assert resp.status == 401
        assert "Set-Cookie" not in resp.headers
        assert "Not logged in" in await resp.text()


@pytest.mark.parametrize("cookie", [None, "fft_0123456789abcdef_forged", "not-a-token"])
async def test_without_a_valid_session_pages_redirect_and_the_api_says_401(
    cluster: Cluster, http: aiohttp.ClientSession, cookie: str | None
) -> None:
    headers = {"Cookie": f"{COOKIE}={cookie}"} if cookie else {}
    for page in ("/", "/tasks", "/tasks/1", "/storage", "/alerts"):
        async with http.get(cluster.url + page, headers=headers, allow_redirects=False) as resp:
            assert resp.status == 303, page
            location = urlsplit(resp.headers["Location"])
            assert (location.path, parse_qs(location.query)["next"]) == ("/login", [page])
    for api in ("/api/whoami", "/api/overview", "/api/tasks", "/api/tasks/1", "/api/series?name=hfai_loss"):
        async with http.get(cluster.url + api, headers=headers) as resp:
            assert resp.status == 401, api
            assert "error" in await resp.json()


async def test_a_bearer_header_works_as_the_cookie_does(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    headers = {"Authorization": f"Bearer {cluster.tokens['bob']}"}
    async with http.get(f"{cluster.url}/api/whoami", headers=headers) as resp:
        assert await resp.json() == {"name": "bob", "admin": False, "groups": []}


async def test_pages_carry_the_user_escaped_and_a_strict_content_policy(
    cluster: Cluster, http: aiohttp.ClientSession, alice_task: int
) -> None:
    status, text, resp = await get(http, cluster, f"/tasks/{alice_task}", "alice")
    assert status == 200
    assert '<span class="who" id="who">alice</span>' in text
    assert XSS not in text  # the task's name reaches the page only through the API and textContent
    assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


async def test_a_user_sees_their_task_and_its_curve(
    cluster: Cluster, http: aiohttp.ClientSession, alice_task: int
) -> None:
    status, task, _ = await get(http, cluster, f"/api/tasks/{alice_task}", "alice")
    assert status == 200
    assert (task["name"], task["user"], task["state"]) == (XSS, "alice", "queued")
    assert task["waiting_because"]
    status, curves, _ = await get(http, cluster, f"/api/tasks/{alice_task}/series?metric=loss", "alice")
    assert status == 200
    (curve,) = curves["series"]
    assert curve["labels"]["user"] == "alice" and curve["labels"]["rank"] == "0"
    assert [(p[0], p[1]) for p in curve["points"]] == [(1, 2.5), (2, 1.75), (3, 1.0), (4, 1.25)]
    status, groups, _ = await get(http, cluster, "/api/tasks", "alice")
    assert [t["task_id"] for t in groups["queued"]] == [str(alice_task)]


async def test_another_user_cannot_see_the_task_nor_its_series(
    cluster: Cluster, http: aiohttp.ClientSession, alice_task: int
) -> None:
    for path in (
        f"/tasks/{alice_task}",
        f"/api/tasks/{alice_task}",
        f"/api/tasks/{alice_task}/series?metric=loss",
        f"/api/tasks/{alice_task}/log",
    ):
        status, body, _ = await get(http, cluster, path, "bob")
        assert status == 404, path
        assert "2.5" not in str(body)
    status, series, _ = await get(http, cluster, f"/api/series?name=hfai_loss&match=task_id%3D{alice_task}", "bob")
    assert status == 200 and series["series"] == []
    status, groups, _ = await get(http, cluster, "/api/tasks", "bob")
    assert all(not g for g in groups.values())


async def test_an_admin_sees_every_task_and_series(
    cluster: Cluster, http: aiohttp.ClientSession, alice_task: int
) -> None:
    status, task, _ = await get(http, cluster, f"/api/tasks/{alice_task}", "root")
    assert status == 200 and task["user"] == "alice"
    status, groups, _ = await get(http, cluster, "/api/tasks", "root")
    assert str(alice_task) in [t["task_id"] for t in groups["queued"]]
    status, series, _ = await get(http, cluster, f"/api/series?name=hfai_loss&match=task_id%3D{alice_task}", "root")
    assert status == 200
    (found,) = series["series"]
    assert found["labels"]["user"] == "alice" and found["points"][-1][1] == 1.25


async def test_the_overview_counts_services_and_nodes(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    status, overview, _ = await get(http, cluster, "/api/overview", "bob")
    assert status == 200
    alive = {s["type"] for s in overview["services"] if s["status"] == "alive"}
    assert {"mgmtd", "scheduler", "telemetry"} <= alive
    assert overview["compute"] == {"nodes": {}, "num_devices": 0, "num_devices_busy": 0, "list": []}
    assert overview["storage"] == {"num_targets": 0, "capacity_bytes": 0, "free_bytes": 0}
    status, storage, _ = await get(http, cluster, "/api/storage?window_s=600", "bob")
    assert (
        status == 200
        and storage["targets"] == []
        and set(storage["charts"]) == {"read_bytes_per_s", "write_bytes_per_s", "read_p99_s", "write_p99_s"}
    )


@pytest.mark.parametrize(
    "path",
    [
        "/api/tasks/abc",
        "/api/tasks/0",
        "/api/tasks/99999999999999999999",
        "/api/tasks/1/series?metric=Loss%21",
        "/api/tasks/1/series?since=nan",
        "/api/tasks/1/series?since=10&until=5",
        "/api/tasks/1/log?node_rank=-1",
        "/api/tasks/1/log?tail_bytes=0",
        "/api/storage?window_s=1",
        "/api/alerts?state=burning",
        "/api/tasks?users=everyone",
        "/api/series?name=bad-name",
        "/api/series?name=hfai_loss&match=nolabel",
        "/api/series?name=hfai_loss&match=task_id%3D~%28",
        "/api/series?name=hfai_loss&step_s=0",
        "/api/series?name=hfai_loss&step_s=0.01",
    ],
)
async def test_malformed_parameters_get_400(cluster: Cluster, http: aiohttp.ClientSession, path: str) -> None:
    status, body, _ = await get(http, cluster, path, "alice")
    assert status == 400, (path, body)
    assert body["error"]
