"""The dashboard in a real headless Chromium (Debian's, driven by playwright): login, the overview, a task page
whose loss curve shows what a training process reports (with ``hfai.telemetry.report``) within 5 s and in
order, and a second user who cannot see the first user's task. Screenshots go to a folder the test prints
(and to ``FF_SCREENSHOT_DIR`` when set)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from .conftest import Cluster

playwright_api = pytest.importorskip(
    "playwright.async_api", reason="playwright is not installed (requirements/dev.txt)"
)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip("no chromium (scripts/bootstrap.sh installs Debian's package)", allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

CURVE_DEADLINE_S = 5.0
# A training process: reports each "step loss" line of stdin with hfai.telemetry.report, says when it did.
REPORTER = """
import sys, time
from hfai import telemetry
for line in sys.stdin:
    step, loss = line.split()
    telemetry.report(step=int(step), loss=float(loss))
    print(time.time(), flush=True)
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folders = [tmp_path_factory.mktemp("screenshots")]
    if os.environ.get("FF_SCREENSHOT_DIR"):
        folders.append(Path(os.environ["FF_SCREENSHOT_DIR"]))
        folders[-1].mkdir(parents=True, exist_ok=True)
    print(f"\ndashboard screenshots in {', '.join(map(str, folders))}")
    return folders


async def screenshot(page: Any, shots: list[Path], name: str) -> None:
    data = await page.screenshot(full_page=True)
    for folder in shots:
        (folder / f"{name}.png").write_bytes(data)


async def login(browser: Any, cluster: Cluster, who: str) -> Any:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await page.goto(cluster.url + "/")
    assert page.url.startswith(cluster.url + "/login")
    await page.fill("#token", cluster.tokens[who])
    await page.click("button[type=submit]")
    await page.wait_for_url(cluster.url + "/")
    assert await page.text_content("#who") == who
    return page


def start_reporter(cluster: Cluster, task_id: int, folder: Path) -> subprocess.Popen[str]:
    labels = {"task_id": str(task_id), "run_id": "1", "node_rank": "0", "rank": "0", "local_rank": "0"}
    env = {
        **os.environ,
        "FF_TELEMETRY_ADDRESS": cluster.telemetry_address,
        "FF_TOKEN": cluster.tokens["alice"],
        "FF_TELEMETRY_LABELS": json.dumps(labels),
        "HFAI_CONFIG": str(folder / "no-hfai-conf.json"),
    }
    return subprocess.Popen(
        [sys.executable, "-c", REPORTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )


async def report(proc: subprocess.Popen[str], steps: list[tuple[int, float]]) -> float:
    """Report ``steps`` one call each; when the last call returned."""
    assert proc.stdin is not None and proc.stdout is not None
    reported_at = 0.0
    for step, loss in steps:
        proc.stdin.write(f"{step} {loss}\n")
        proc.stdin.flush()
        reported_at = float(await asyncio.to_thread(proc.stdout.readline))
    return reported_at


async def curve_points(page: Any) -> list[list[float]]:
    """The points the loss chart draws, read back from its SVG."""
    raw = await page.evaluate(
        "() => Array.from(document.querySelectorAll('#loss-chart .curve')).map(c => c.dataset.values)"
    )
    return [p for values in raw for p in json.loads(values)]


async def wait_curve(page: Any, expected: list[list[float]], since: float) -> float:
    """Seconds from ``since`` until the chart shows ``expected``; fails past CURVE_DEADLINE_S."""
    while True:
        points = await curve_points(page)
        if points == expected:
            return time.time() - since
        if time.time() - since > CURVE_DEADLINE_S:
            raise AssertionError(f"after {CURVE_DEADLINE_S} s the loss curve shows {points}, not {expected}")
        await asyncio.sleep(0.05)


async def test_dashboard_in_chromium(browser: Any, cluster: Cluster, shots: list[Path]) -> None:
    task_id = await cluster.submit("alice", "resnet <b>demo</b>")
    reporter = start_reporter(cluster, task_id, cluster.folder)
    try:
        alice = await login(browser, cluster, "alice")
        await alice.wait_for_selector("#services table")
        assert "telemetry" in (await alice.text_content("#services") or "")
        await screenshot(alice, shots, "overview")

        await alice.goto(f"{cluster.url}/tasks/{task_id}")
        await alice.wait_for_selector("#facts dd")
        assert await alice.text_content("#title") == f"Task {task_id}: resnet <b>demo</b>"  # shown as text
        first = [(1, 2.5), (2, 1.9), (3, 1.6)]
        took = await wait_curve(alice, [[s, v] for s, v in first], await report(reporter, first))
        more = [(4, 1.7), (5, 1.2)]
        took_more = await wait_curve(alice, [[s, v] for s, v in first + more], await report(reporter, more))
        print(f"loss on the task page {took:.2f} s and {took_more:.2f} s after it was reported")
        await screenshot(alice, shots, "task")

        bob = await login(browser, cluster, "bob")
        response = await bob.goto(f"{cluster.url}/tasks/{task_id}")
        assert response is not None and response.status == 404
        api = await bob.request.get(f"{cluster.url}/api/tasks/{task_id}/series?metric=loss")
        assert api.status == 404 and "2.5" not in await api.text()
        await bob.goto(f"{cluster.url}/tasks")
        await bob.wait_for_selector("#queued p.empty")
        assert "resnet" not in (await bob.text_content("main") or "")
        await screenshot(bob, shots, "tasks-of-another-user")
    finally:
        if reporter.stdin is not None:
            reporter.stdin.close()
        await asyncio.to_thread(reporter.wait, 10)  # off the loop: telemetry here takes its last flush
        if reporter.stdout is not None:
            reporter.stdout.close()
