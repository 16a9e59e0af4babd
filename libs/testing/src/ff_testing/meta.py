"""Run meta services as processes for tests, benchmarks and the appliance's checks."""

from __future__ import annotations

from pathlib import Path

from ff_testing.process import ServiceProcess, service_process


class MetaProcess(ServiceProcess):
    """A meta service process (see ``meta_process``)."""

    async def ready(self, timeout_s: float = 60.0) -> MetaProcess:
        """Wait until the process has registered with mgmtd; this process."""
        return await super().ready(timeout_s)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        self.terminate(timeout_s=15.0)

    def start_again(self) -> None:
        """Start the stopped (or killed) service again on the address it listened on, so its clients keep it.

        After ``ready``: the same settings and database, the port it had (the first start may have had port 0).
        """
        args, address = list(self.args), self.address
        if "--listen-address" in args:
            args[args.index("--listen-address") + 1] = address
        else:
            args += ["--listen-address", address]
        self.args = args
        self.start()


def meta_process(
    folder: Path, name: str, *, mgmtd_address: str, cluster_token: str, database_url: str, **settings: object
) -> MetaProcess:
    """A meta service (``python -m ff_meta``) not yet started; ``settings`` become ``--flags``."""
    values = {
        "mgmtd_addresses": mgmtd_address,
        "database_url": database_url,
        "instance_id": name,
        "metrics_address": "",
        **settings,
    }
    return service_process("meta", folder, name, cluster_token=cluster_token, settings=values, kind=MetaProcess)
