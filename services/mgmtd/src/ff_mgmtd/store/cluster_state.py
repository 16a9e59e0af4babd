"""Cluster identity, election lease, instances, and the primary's fence on every write."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, func, insert, select, update
from sqlalchemy.orm import Session

from ff_mgmtd.core.errors import NoFreeId, NotPrimary
from ff_mgmtd.core.lease import Campaign, LeaseRow, campaign, primary_address
from ff_mgmtd.core.model import MgmtdInstance
from ff_mgmtd.store.schema import cluster, election, instances
from ff_store import db_now


@dataclass(frozen=True)
class Fence:
    """The primacy a write was decided under: it commits only if the lease is still ours at that epoch."""

    instance_id: str
    epoch: int


def next_free_id(s: Session, column: Column[Any], first: int, last: int) -> int:
    """The id after the largest in ``first..last``, or, once ``last`` is taken, the lowest free one.

    Ids are uint32 on the wire: a caller who claimed the largest id must not push the next one out of range.
    """
    in_range = (column >= first) & (column <= last)
    top = s.execute(select(func.max(column)).where(in_range)).scalar()
    if top is None:
        return first
    if int(top) < last:
        return int(top) + 1
    if s.execute(select(column).where(column == first)).first() is None:
        return first
    taken = column.table.alias()
    successor_taken = select(taken.c[column.name]).where(taken.c[column.name] == column + 1).exists()
    gap = s.execute(select(func.min(column + 1)).where(in_range, column < last, ~successor_taken)).scalar()
    if gap is None:
        raise NoFreeId(f"every id in {first}..{last} is taken")
    return int(gap)


def ensure_cluster(s: Session, now: float) -> str:
    """The cluster id, created at the first start of the first instance."""
    row = s.execute(select(cluster.c.cluster_id).where(cluster.c.id == 1)).scalar_one_or_none()
    if row is not None:
        return str(row)
    cluster_id = uuid.uuid4().hex
    s.execute(insert(cluster).values(id=1, cluster_id=cluster_id, created_at=now, routing_version=1))
    return cluster_id


def get_cluster_id(s: Session) -> str:
    """The cluster id ``ensure_cluster`` created (it must have run)."""
    return str(s.execute(select(cluster.c.cluster_id).where(cluster.c.id == 1)).scalar_one())


def routing_version(s: Session) -> int:
    """The stored routing version: it moves whenever nodes, chains or chain tables change."""
    return int(s.execute(select(cluster.c.routing_version).where(cluster.c.id == 1)).scalar_one())


def bump_routing_version(s: Session) -> int:
    """Count one routing change in this transaction; returns the new version (to publish after the commit)."""
    version = routing_version(s) + 1
    s.execute(update(cluster).where(cluster.c.id == 1).values(routing_version=version))
    return version


def read_lease(s: Session) -> LeaseRow | None:
    """The election row, or None before the first campaign."""
    row = s.execute(select(election).where(election.c.id == 1)).first()
    if row is None:
        return None
    return LeaseRow(row.holder_id, row.holder_address, float(row.expires_at), int(row.epoch))


def run_campaign(s: Session, instance_id: str, address: str, lease_s: float) -> tuple[Campaign, float]:
    """One election tick of one instance (in one serializable transaction), plus its liveness row.

    Returns the outcome and the database's time it was decided at.
    """
    now = db_now(s)
    current = read_lease(s)
    result = campaign(current, instance_id, address, now, lease_s)
    if result.changed:
        values = {
            "holder_id": result.row.holder_id,
            "holder_address": result.row.holder_address,
            "expires_at": result.row.expires_at,
            "epoch": result.row.epoch,
        }
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
    return result, now


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
    """The election row and the primary's address ("" while the lease is expired), on the database clock."""
    now = db_now(s)
    row = read_lease(s)
    return row, primary_address(row, now)


def list_instances(s: Session) -> list[MgmtdInstance]:
    """Every instance that ever campaigned, by id; the holder of an unexpired lease is the primary."""
    now = db_now(s)
    row = read_lease(s)
    holder = row.holder_id if row is not None and row.expires_at > now else ""
    rows = s.execute(select(instances).order_by(instances.c.instance_id)).all()
    return [
        MgmtdInstance(
            instance_id=r.instance_id,
            address=r.address,
            is_primary=r.instance_id == holder,
            last_seen_at=float(r.last_seen_at),
        )
        for r in rows
    ]
