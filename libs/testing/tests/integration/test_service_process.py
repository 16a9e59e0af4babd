"""A service process that dies before it is ready: the test's failure carries the end of its log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ff_testing.process import ServiceProcess


async def test_a_process_that_exits_before_ready_shows_its_log(tmp_path: Path) -> None:
    script = "import sys; print('ImportError: no module named ff_broken', flush=True); sys.exit(3)"
    service = ServiceProcess("m1", tmp_path, [sys.executable, "-c", script], env={})
    service.start()
    with pytest.raises(RuntimeError) as failure:
        await service.ready(timeout_s=20)
    assert "exited with 3 before it was ready" in str(failure.value)
    assert "the end of m1.log" in str(failure.value) and "no module named ff_broken" in str(failure.value)
