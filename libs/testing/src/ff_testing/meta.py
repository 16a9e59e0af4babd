"""Run meta services as processes for tests, benchmarks and the appliance's checks."""

from __future__ import annotations

import os
from pathlib import Path

from ff_testing.process import ServiceProcess, module_args


class MetaProcess(ServiceProcess):
    """A meta service process (see ``meta_process``)."""

    @property
    def address(self) -> str:
        """The gRPC address the process serves on."""
        return str(self.info["grpc"])

    async def ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the process has registered with mgmtd."""
        await super().ready(timeout_s)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        self.terminate(timeout_s=15.0)


def meta_process(
    folder: Path, name: str, *, mgmtd_address: str, cluster_token: str, database_url: str, **settings: object
) -> MetaProcess:
    """A meta service (``python -m ff_meta``) not yet started; ``settings`` become ``--flags``."""
    flags = {
        "mgmtd-addresses": mgmtd_address,
        "database-url": database_url,
        "instance-id": name,
        "metrics-address": "",
        **{k.replace("_", "-"): str(v) for k, v in settings.items()},
    }
    env = {**os.environ, "FF_META_CLUSTER_TOKEN": cluster_token}
    folder.mkdir(parents=True, exist_ok=True)
    return MetaProcess(name, folder, module_args("ff_meta", flags), env)
