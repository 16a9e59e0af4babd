"""``fireflyer up --database URL`` on the test PostgreSQL server: mgmtd, meta, the scheduler and telemetry keep
their state there (a schema each, no SQLite file anywhere), two mgmtd and two meta instances share it, a file
system workload runs, the mgmtd primary is SIGKILLed and the other takes over with the files intact, and a later
``up`` keeps the cluster on that database (and refuses another)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import hf3fs

from .conftest import Appliance

FAILOVER_S = 60.0  # mgmtd's lease is 10 s in the appliance; a loaded CI runner takes several times longer


def _status(appliance: Appliance) -> dict[str, Any]:
    result = appliance.run("status", "--json")
    status: dict[str, Any] = json.loads(result.out)
    return status


def _primary(appliance: Appliance) -> str | None:
    found = [s["instance"] for s in _status(appliance)["services"] if s.get("primary")]
    return found[0] if len(found) == 1 else None


def _workload(fs: Any, folder: str, n: int) -> dict[str, bytes]:
    """Files written, one renamed, all read back and listed."""
    fs.makedirs(folder, exist_ok=True)
    written = {f"{folder}/f{i}": os.urandom(1000 + 97 * i) for i in range(n)}
    for path, data in written.items():
        with fs.open(path, "wb") as f:
            f.write(data)
    fs.rename(f"{folder}/f0", f"{folder}/renamed")
    written[f"{folder}/renamed"] = written.pop(f"{folder}/f0")
    assert sorted(fs.listdir(folder)) == sorted(p.rsplit("/", 1)[1] for p in written)
    for path, data in written.items():
        with fs.open(path, "rb") as f:
            assert f.read() == data, path
    return written


def test_a_cluster_on_postgresql_fails_over_and_stays_there(appliance: Appliance, postgres_url: str) -> None:
    appliance.ok("up", "--mgmtd", "2", "--meta", "2", "--database", postgres_url, timeout_s=240)
    state = appliance.state_dir
    assert not [p for p in state.rglob("*.db*") if p.is_file()], "a service kept state in SQLite"
    assert (state / "secrets" / "database_url").stat().st_mode & 0o077 == 0

    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            per_schema = sa.text(
                "SELECT table_schema, count(*) FROM information_schema.tables "
                "WHERE table_schema LIKE 'fireflyer_%' GROUP BY table_schema"
            )
            rows = conn.execute(per_schema).all()
    finally:
        engine.dispose()
    tables = dict(rows)
    services = {f"fireflyer_{s}" for s in ("mgmtd", "meta", "scheduler", "telemetry")}
    assert set(tables) == services | {"fireflyer_appliance"}, tables  # and the record of the cluster it holds
    assert all(tables[s] >= 2 for s in services), tables  # each its own tables and migration history

    plan = json.loads((state / "plan.json").read_text())
    mgmtd = [f"{i['host']}:{i['grpc_port']}" for i in plan["instances"] if i["service"] == "mgmtd"]
    token = (state / "secrets" / "admin_token").read_text().strip()
    with hf3fs.connect(mgmtd=mgmtd, token=token) as fs:
        before = _workload(fs, "/pg/before", 12)

    primary = _primary(appliance)
    assert primary is not None
    os.kill(appliance.pids()[primary], signal.SIGKILL)
    deadline = time.monotonic() + FAILOVER_S
    while _primary(appliance) in (None, primary):
        assert time.monotonic() < deadline, f"no other mgmtd became primary within {FAILOVER_S:g} s"
        time.sleep(0.5)
    with hf3fs.connect(mgmtd=mgmtd, token=token) as fs:
        for path, data in before.items():  # what meta committed before the failover is all there
            with fs.open(path, "rb") as f:
                assert f.read() == data, path
        _workload(fs, "/pg/after", 6)

    # A later `up` (no --database) restarts the killed instance on the same database; another is refused.
    appliance.ok("up", timeout_s=120)
    deadline = time.monotonic() + FAILOVER_S
    while not (status := _status(appliance))["healthy"]:
        assert time.monotonic() < deadline, status["problems"]
        time.sleep(0.5)
    assert not [p for p in state.rglob("*.db*") if p.is_file()]
    refused = appliance.run("up", "--database", postgres_url.rsplit("/", 1)[0] + "/another")
    assert refused.code != 0 and "cannot move to another database" in refused.err, refused
    # Another cluster (another state folder, another cluster token) never adopts this one's state there.
    other = Appliance(appliance.state_dir.parent / "other-state")
    taken = other.run("up", "--database", postgres_url, timeout_s=60)
    assert taken.code != 0 and "holds another cluster's state" in taken.err, taken
    assert not (other.state_dir / "plan.json").exists()


def test_up_refuses_a_database_it_cannot_use(appliance: Appliance, tmp_path: Path) -> None:
    for url, says in (
        (f"sqlite:///{tmp_path / 'x.db'}", "takes a PostgreSQL URL"),
        ("postgresql://nobody@127.0.0.1:1/db", "cannot prepare"),
        ("postgresql://u@127.0.0.1/db?options=-cfoo", "may not set options"),
    ):
        result = appliance.run("up", "--database", url, timeout_s=60)
        assert result.code != 0 and says in result.err, (url, result)
        assert not (appliance.state_dir / "plan.json").exists()  # nothing started, nothing chosen
        assert not (appliance.state_dir / "secrets" / "database_url").exists()
