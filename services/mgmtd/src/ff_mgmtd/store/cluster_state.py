"""Cluster identity, election lease, instances, and the primary's fence on every write."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from ff_mgmtd.core.errors import NotPrimary
from ff_mgmtd.core.lease import Campaign, LeaseRow, campaign, primary_address
from ff_mgmtd.core.model import MgmtdInstance
from ff_mgmtd.store.schema import cluster, election, instances
from ff_store import db_now


@dataclass(frozen=True)
class Fence:
    """The primacy a write was decided under: it commits only if the lease is still ours at that epoch."""

    instance_id: str
    epoch: int


def ensure_cluster(s: Session, now: float) -> str:
    """The cluster id, created at the first start of the first instance."""
    row = s.execute(select(cluster.c.cluster_id).where(cluster.c.id == 1)).scalar_one_or_none()
    if row is not None:
        return str(row)
    cluster_id = uuid.uuid4().hex
    s.execute(insert(cluster).values(id=1, cluster_id=cluster_id, created_at=now, routing_version=1))
    return cluster_id


def routing_version(s: Session) -> int:
    return int(s.execute(select(cluster.c.routing_version).where(cluster.c.id == 1)).scalar_one())


def bump_routing_version(s: Session) -> int:
    version = routing_version(s) + 1
    s.execute(update(cluster).where(cluster.c.id == 1).values(routing_version=version))
    return version


def read_lease(s: Session) -> LeaseRow | None:
    row = s.execute(select(election).where(election.c.id == 1)).first()
    if row is None:
        return None
    return LeaseRow(row.holder_id, row.holder_address, float(row.expires_at), int(row.epoch))


def run_campaign(s: Session, instance_id: str, address: str, lease_s: float) -> Campaign:
    """One election tick of one instance (in one serializable transaction), plus its liveness row."""
    now = db_now(s)
    current = read_lease(s)
    result = campaign(current, instance_id, address, now, lease_s)
    if result.changed:
        values = {
            "holder_id": result.row.holder_id, "holder_address": result.row.holder_address,
            "expires_at": result.row.expires_at, "epoch": result.row.epoch,
        }  # fmt: skip
        if current is None:
            s.execute(insert(election).values(id=1, **values))
        else:
            s.execute(update(election).where(election.c.id == 1).values(**values))
    seen = s.execute(select(instances.c.instance_id).where(instances.c.instance_id == instance_id)).first()
    if seen is None:
        s.execute(insert(instances).values(instance_id=instance_id, address=address, last_seen_at=now))
    else:
        stmt = update(instances).where(instances.c.instance_id == instance_id)
        s.execute(stmt.values(address=address, last_seen_at=now))
    return result


def resign(s: Session, fence: Fence) -> None:
    """Give the lease up at once (graceful stop), so a standby need not wait for it to expire."""
    now = db_now(s)
    row = read_lease(s)
    if row is not None and row.holder_id == fence.instance_id and row.epoch == fence.epoch:
        s.execute(update(election).where(election.c.id == 1).values(expires_at=now))


def check_fence(s: Session, fence: Fence) -> None:
    """Raise NotPrimary unless ``fence`` still holds an unexpired lease, at the same epoch."""
    now = db_now(s)
    row = read_lease(s)
    if row is None or row.holder_id != fence.instance_id or row.epoch != fence.epoch or row.expires_at <= now:
        raise NotPrimary(primary_address(row, now))


def current_primary(s: Session) -> tuple[LeaseRow | None, str]:
    now = db_now(s)
    row = read_lease(s)
    return row, primary_address(row, now)


def list_instances(s: Session) -> list[MgmtdInstance]:
    now = db_now(s)
    row = read_lease(s)
    holder = row.holder_id if row is not None and row.expires_at > now else ""
    rows = s.execute(select(instances).order_by(instances.c.instance_id)).all()
    return [
        MgmtdInstance(instance_id=r.instance_id, address=r.address, is_primary=r.instance_id == holder,
                      last_seen_at=float(r.last_seen_at))
        for r in rows
    ]  # fmt: skip
