"""The tools part of ``fireflyer demo``: the ``hf3fs`` command and pandas on an ``hf3fs://`` path.

The ``hf3fs`` command copies a file in and lists it, and pandas writes and reads a parquet file at an ``hf3fs://`` path
through the fsspec filesystem.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

NUM_TOOLS_STEPS = 2
CLI_TIMEOUT_S = 60.0


class ToolsDemoError(Exception):
    """A tool did not behave as the demo expects."""


async def tools_section(
    addresses: Sequence[str], token: str, step: Callable[[str], None], say: Callable[[str], None]
) -> None:
    """Run the tools steps with ``token`` (``step`` prints a title, ``say`` a result); blocking work off the loop.

    Raises:
        ToolsDemoError: a command failed, or what was read back differs from what was written.
    """
    await asyncio.to_thread(_run, ",".join(addresses), token, step, say)


def _hf3fs(mgmtd: str, token: str, *args: str) -> str:
    env = {**os.environ, "FF_MGMTD_ADDRESSES": mgmtd, "FF_TOKEN": token}
    proc = subprocess.run(
        [sys.executable, "-m", "hf3fs", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise ToolsDemoError(f"hf3fs {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def _run(mgmtd: str, token: str, step: Callable[[str], None], say: Callable[[str], None]) -> None:
    top = f"/demo/tools-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    step("hf3fs CLI: copy a local file in, list it, read it back")
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "hello.txt"
        local.write_text("hello from the local disk\n")
        _hf3fs(mgmtd, token, "mkdir", "-p", top)
        _hf3fs(mgmtd, token, "cp", str(local), f"hf3fs:{top}/hello.txt")
        say(f"$ export FF_MGMTD_ADDRESSES={mgmtd} FF_TOKEN=...; hf3fs cp hello.txt hf3fs:{top}/hello.txt")
        say(f"$ hf3fs ls -l {top}")
        for line in _hf3fs(mgmtd, token, "ls", "-l", top).splitlines():
            say(f"  {line}")
        back = _hf3fs(mgmtd, token, "cat", f"{top}/hello.txt")
        if back != local.read_text():
            raise ToolsDemoError(f"hf3fs cat returned {back!r}")
        say(f"$ hf3fs cat {top}/hello.txt -> {back.strip()!r}")

    step("fsspec: pandas writes a parquet file to an hf3fs:// path and reads it back")
    import fsspec  # here, not at the top: every `fireflyer` command imports this module

    url, options = f"hf3fs://{top}/frame.parquet", {"mgmtd": mgmtd, "token": token}
    try:
        pd: Any = importlib.import_module("pandas")
    except ImportError:  # pandas is a dev dependency; plain fsspec shows the same path
        with fsspec.open(url.replace(".parquet", ".txt"), "wb", **options) as f:
            f.write(b"written through fsspec\n")
        say(f"pandas is not installed; fsspec wrote {url.replace('.parquet', '.txt')}")
        return
    df = pd.DataFrame({"step": range(5), "loss": [2.0 / (i + 1) for i in range(5)]})
    df.to_parquet(url, storage_options=options)
    back_df = pd.read_parquet(url, storage_options=options)
    if not back_df.equals(df):
        raise ToolsDemoError("the data frame read back differs")
    size = fsspec.filesystem("hf3fs", **options).info(url)["size"]
    say(f'df.to_parquet("{url}", storage_options=...) wrote {size} bytes; pd.read_parquet gave an equal frame')
