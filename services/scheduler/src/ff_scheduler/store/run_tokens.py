"""The run-token ledger: which tokens were issued for which run, so they are revoked when the run ends.

The revocation is done by this scheduler process or the next one.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from ff_scheduler.store.schema import run_tokens, runs
from ff_scheduler.store.ticks import ACTIVE


def record(s: Session, token_id: str, run_id: int, now: float) -> None:
    """Note a token issued for ``run_id`` (before it is handed out)."""
    s.execute(insert(run_tokens).values(token_id=token_id, run_id=run_id, issued_at=now))


def ended(s: Session, limit: int = 100) -> list[tuple[str, int]]:
    """Tokens (id, run id) whose run is no longer active (or no longer exists), oldest first."""
    active = select(runs.c.run_id).where(runs.c.state.in_(ACTIVE))
    query = (
        select(run_tokens.c.token_id, run_tokens.c.run_id)
        .where(run_tokens.c.run_id.not_in(active))
        .order_by(run_tokens.c.issued_at)
        .limit(limit)
    )
    return [(str(r.token_id), int(r.run_id)) for r in s.execute(query)]


def forget(s: Session, token_ids: Collection[str]) -> None:
    """Drop revoked tokens from the ledger."""
    if token_ids:
        s.execute(delete(run_tokens).where(run_tokens.c.token_id.in_(list(token_ids))))
