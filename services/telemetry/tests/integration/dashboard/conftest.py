"""A real cluster for the dashboard's tests: mgmtd (with alice, bob and the admin root), the scheduler and the
collector, in this process; one per test module."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from ff_testing.mgmtd import CLUSTER_TOKEN, running_with_users
from ff_testing.scheduler import SchedulerClient, spec
from ff_testing.scheduler import start_in_process as start_scheduler
from ff_testing.telemetry import TelemetryClient
from ff_testing.telemetry import start_in_process as start_telemetry
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as spb
from fireflyer.telemetry.v1 import telemetry_pb2 as pb


@dataclass
class Cluster:
    folder: Path
    mgmtd_address: str
    scheduler_address: str
    telemetry_address: str
    http: str
    tokens: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://{self.http}"

    async def submit(self, who: str, name: str) -> int:
        """A task of ``who`` (it stays queued: no agent runs here); its id, once a tick said why it waits."""
        client = SchedulerClient(self.scheduler_address, self.tokens[who])
        try:
            resp = await client.call(client.user.SubmitTask, spb.SubmitTaskRequest(spec=spec(1, 10, name=name)))
            task_id = int(resp.task.task_id)

            async def reason_given() -> bool:
                got = await client.call(client.user.GetTask, spb.GetTaskRequest(task_id=task_id))
                return bool(got.task.queue_reason != spb.QUEUE_REASON_UNSPECIFIED)

            await eventually(reason_given, timeout_s=30, what=f"the scheduler's reason for task {task_id} to wait")
        finally:
            await client.close()
        return task_id

    async def report(self, who: str, task_id: int, *steps: tuple[int, float]) -> None:
        """What ``hfai.telemetry.report(step=, loss=)`` pushes from rank 0 of the task, with ``who``'s token."""
        client = TelemetryClient(self.telemetry_address, self.tokens[who])
        now = time.time()
        samples = [
            pb.Sample(name=name, value=value, sampled_at=now + i * 1e-3)
            for i, (step, loss) in enumerate(steps)
            for name, value in (("hfai_step", float(step)), ("hfai_loss", loss))
        ]
        labels = {"task_id": str(task_id), "run_id": "1", "rank": "0", "node_rank": "0", "local_rank": "0"}
        try:
            await client.call(client.stub.PushSamples, pb.PushSamplesRequest(samples=samples, common_labels=labels))
        finally:
            await client.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    folder = Path(tmp_path_factory.mktemp("dashboard"))
    async with running_with_users(folder, f"sqlite:///{folder / 'mgmtd.db'}") as (mgmtd, tokens):
        scheduler = await start_scheduler(folder, f"sqlite:///{folder / 'sched.db'}", mgmtd.address, CLUSTER_TOKEN)
        telemetry = await start_telemetry(
            folder, f"sqlite:///{folder / 'telemetry.db'}", mgmtd.address, CLUSTER_TOKEN, scrape_interval_s=0
        )
        try:
            yield Cluster(folder, mgmtd.address, scheduler.address, telemetry.address, telemetry.http_address, tokens)
        finally:
            await telemetry.shutdown()
            await scheduler.shutdown()
