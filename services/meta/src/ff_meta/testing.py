"""Run meta services as processes for tests, benchmarks and the appliance's checks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class MetaProcess:
    name: str
    folder: Path
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ready_file(self) -> Path:
        return self.folder / f"{self.name}.ready.json"

    @property
    def address(self) -> str:
        return str(self.info["grpc"])

    def start(self) -> None:
        self.ready_file.unlink(missing_ok=True)
        with (self.folder / f"{self.name}.log").open("ab") as out:
            self.proc = subprocess.Popen([*self.args, "--ready-file", str(self.ready_file)], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)  # fmt: skip

    async def ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                self.info = json.loads(self.ready_file.read_text())
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was ready")
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{self.name} did not become ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def meta_process(folder: Path, name: str, *, mgmtd_address: str, cluster_token: str, database_url: str,
                 **settings: object) -> MetaProcess:  # fmt: skip
    """A meta service (``python -m ff_meta``) not yet started; ``settings`` become ``--flags``."""
    flags = {"mgmtd-addresses": mgmtd_address, "database-url": database_url, "instance-id": name,
             "metrics-address": "", **{k.replace("_", "-"): str(v) for k, v in settings.items()}}  # fmt: skip
    args = [sys.executable, "-m", "ff_meta"]
    for k, v in flags.items():
        args += [f"--{k}", v]
    env = {**os.environ, "FF_META_CLUSTER_TOKEN": cluster_token}
    folder.mkdir(parents=True, exist_ok=True)
    return MetaProcess(name, folder, args, env)
