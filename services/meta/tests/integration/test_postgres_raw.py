"""On PostgreSQL meta's transactions run on bare cursors of connections kept for them (no ORM session per call);
a body that needs the session is rolled back there and runs again with one, all or nothing either way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ff_meta.core.errors import FsCode, FsError
from ff_meta.core.model import Defaults, Inode, LayoutSpec, PathAt
from ff_meta.core.perms import Caller
from ff_meta.store.fsops import files, namespace, quotas, reads
from ff_meta.store.metastore import MetaStore

ALICE = Caller(1000, (1000,), "alice")
ROOT = Caller(0, (0,), "root", is_root=True)
DEFAULTS = Defaults(LayoutSpec(1, 1 << 20, 4), {1: (0, 6)}, 30.0)


def create(path: str, inode_id: int) -> Callable[[Any], Inode]:
    return lambda t: files.create(t, PathAt(0, path), 0o644, True, False, None, inode_id, DEFAULTS)[0]


async def test_postgres_calls_run_on_kept_connections_and_fall_back_for_the_orm(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await asyncio.to_thread(MetaStore.open, postgres_url)
    with_session: list[bool] = []
    arun = store._store.arun

    def counted(fn: Callable[..., Any], **kwargs: Any) -> Awaitable[Any]:
        with_session.append(bool(kwargs.get("read_only")))
        return arun(fn, **kwargs)

    monkeypatch.setattr(store._store, "arun", counted)
    try:
        await store.write(ALICE, lambda t: namespace.mkdirs(t, PathAt(0, "/q"), 0o755, False, None, [900]))
        made = await asyncio.gather(*(store.write(ALICE, create(f"/q/f{k}", 1000 + k)) for k in range(8)))
        stats = await asyncio.gather(
            *(
                store.read(ALICE, lambda t, k=k: reads.stat_with_sessions(t, PathAt(0, f"/q/f{k}"), True))
                for k in range(8)
            )
        )
        assert [s[0].inode_id for s in stats] == [m.inode_id for m in made] and not with_session
        # Setting a quota needs the session: rolled back on the kept connection, then run with one (once).
        await store.write(ROOT, lambda t: quotas.set_quota(t, PathAt(0, "/q"), 0, 10))
        assert with_session == [False]
        with pytest.raises(FsError) as err:  # 1 + 8 inodes under the quota of 10: the second create is refused
            for k in range(8, 10):
                await store.write(ALICE, create(f"/q/f{k}", 1000 + k))
        assert err.value.fs_code is FsCode.QUOTA_EXCEEDED
        names = await store.read(ALICE, lambda t: reads.list_dir(t, PathAt(0, "/q"), 100, "", False))
        assert [e[0] for e in names[0]] == [f"f{k}" for k in range(9)]  # the refused one left nothing
    finally:
        await store.close()
        store.dispose()
