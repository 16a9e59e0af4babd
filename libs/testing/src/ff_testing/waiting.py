"""Waits on conditions, for tests: poll until a check holds, or fail after a timeout naming what was awaited.

What a test would otherwise do with a fixed sleep ("let it land"): a wait that ends as soon as the condition
holds, and whose failure says which condition did not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout_s: float = 60.0, what: str = "condition", interval_s: float = 0.05
) -> None:
    """Poll ``check`` every ``interval_s`` until it returns True.

    Raises:
        TimeoutError: ``check`` did not return True within ``timeout_s`` (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)


def wait_until(
    check: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition", interval_s: float = 0.05
) -> None:
    """``eventually`` for a test without an event loop: poll ``check`` (a plain function) until it returns True.

    Raises:
        TimeoutError: ``check`` did not return True within ``timeout_s`` (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)
