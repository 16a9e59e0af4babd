"""Two meta instances on one PostgreSQL database under concurrent creates, renames, links and removes in
the same directories: afterwards a full scan of the tables finds a consistent tree."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter, defaultdict

import sqlalchemy as sa

import hf3fs
from ff_meta.store.schema import counters, dirents, inodes, sessions, trash
from ff_testing.cluster import CLUSTER_TOKEN
from ff_testing.meta import meta_process

from .conftest import MetaCluster

DIRS = ["/c/a", "/c/b", "/c/a/x", "/c/b/y"]
DURATION_S = 8.0
MAX_DURATION_S = 60.0
THREADS_PER_META = 2
FILE, DIR, LINK = 1, 2, 3


def _worker(fs: hf3fs.FileSystem, seed: int, stop: threading.Event, done: Counter[str]) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        d1, d2 = rng.choice(DIRS), rng.choice(DIRS)
        n1, n2 = f"n{rng.randrange(6)}", f"n{rng.randrange(6)}"
        op = rng.choice(["create", "mkdir", "rename", "rename", "remove", "rmtree", "link", "list"])
        try:
            if op == "create":
                fs.create(f"{d1}/{n1}")
            elif op == "mkdir":
                fs.mkdir(f"{d1}/{n1}")
            elif op == "rename":
                # Directories too: some of these would make a cycle (moving a or b below itself).
                src = rng.choice([f"{d1}/{n1}", d1])
                fs.rename(src, f"{d2}/{n2}")
            elif op == "remove":
                fs.remove(f"{d1}/{n1}")
            elif op == "rmtree":
                fs.rmtree(f"{d1}/{n1}")
            elif op == "link":
                fs.link(f"{d1}/{n1}", f"{d2}/{n2}")
            else:
                fs.listdir(d1)
            done[op] += 1
        except OSError:
            done["error"] += 1  # ENOENT, EEXIST, EINVAL (loop), ENOTEMPTY...: expected under this race
        if rng.random() < 0.05:  # put the working directories back when a rename moved them away
            for d in DIRS:
                with contextlib.suppress(OSError):
                    fs.makedirs(d, exist_ok=True)


def _enough(done: Counter[str]) -> bool:
    """Enough successful operations for the race to mean something: over 100, renames and creates among them."""
    counts = dict(done)  # one C-level copy: the workers add keys meanwhile
    ok = sum(v for k, v in counts.items() if k != "error")
    return ok > 100 and counts.get("rename", 0) > 10 and counts.get("create", 0) > 10


def check_tree(engine: sa.Engine) -> dict[str, int]:  # noqa: PLR0912, PLR0915
    """Full scan: every invariant of the namespace; returns counts."""
    with engine.connect() as conn:
        nodes = {r.inode_id: r for r in conn.execute(sa.select(inodes))}
        ents = list(conn.execute(sa.select(dirents)))
        # A file's links may go to the trash one by one: one trash entry per link.
        trashed = Counter(r.inode_id for r in conn.execute(sa.select(trash)))
        trash_roots = set(trashed)
        open_files = {r.inode_id for r in conn.execute(sa.select(sessions))}
        next_id = conn.execute(sa.select(counters.c.value).where(counters.c.name == "next_inode_id")).scalar_one()
    names = Counter((e.parent_id, e.name) for e in ents)
    assert not [k for k, n in names.items() if n > 1], "duplicate names"
    links: dict[int, list[sa.Row[tuple[int, str, int, int]]]] = defaultdict(list)
    for e in ents:
        assert e.inode_id in nodes, f"entry {e.name!r} in {e.parent_id} points to missing inode {e.inode_id}"
        assert e.parent_id in nodes and nodes[e.parent_id].type == DIR, f"entry {e.name!r} in a non-directory"
        assert e.type == nodes[e.inode_id].type, f"entry {e.name!r} has the wrong type"
        links[e.inode_id].append(e)  # type: ignore[arg-type]
    for inode_id, node in nodes.items():
        assert inode_id < next_id
        if inode_id == 1:
            assert not links[1], "the root has an entry"
            continue
        if node.type == DIR:
            if inode_id in trash_roots:
                assert not links[inode_id] and node.parent_id == 0
            else:
                assert len(links[inode_id]) == 1, f"directory {inode_id} has {len(links[inode_id])} entries"
                assert links[inode_id][0].parent_id == node.parent_id, f"directory {inode_id}: wrong parent id"
        elif node.type == FILE:
            expect = len(links[inode_id]) + trashed[inode_id]
            assert node.nlink == expect or (node.nlink == 0 and inode_id in open_files), (
                f"file {inode_id}: nlink {node.nlink}, {expect} links"
            )
            assert expect > 0 or inode_id in open_files, f"orphan file {inode_id}"
        else:
            assert len(links[inode_id]) + (inode_id in trash_roots) == 1, f"symlink {inode_id} orphaned"
    # Reachability without cycles: from the root and from every trash entry, each inode at most once.
    children: dict[int, list[int]] = defaultdict(list)
    for e in ents:
        children[e.parent_id].append(e.inode_id)
    seen_dirs: set[int] = set()
    reached: set[int] = set()
    for start in [1, *trash_roots]:
        stack = [start]
        while stack:
            cur = stack.pop()
            reached.add(cur)
            if nodes[cur].type == DIR:
                assert cur not in seen_dirs, f"directory {cur} reached twice: a cycle or a second parent"
                seen_dirs.add(cur)
                stack.extend(children[cur])
    orphans = set(nodes) - reached
    assert not orphans, f"inodes not reachable from the root or the trash: {sorted(orphans)[:10]}"
    # Walking up from any directory ends at the root.
    for inode_id, node in nodes.items():
        if node.type != DIR or inode_id in trash_roots:
            continue
        cur, hops = inode_id, 0
        while cur != 1 and nodes[cur].parent_id != 0:
            cur = nodes[cur].parent_id
            hops += 1
            assert hops < len(nodes), f"parent chain of {inode_id} loops"
    return {"inodes": len(nodes), "entries": len(ents), "trash": len(trash_roots)}


def test_two_meta_instances_on_postgres_keep_the_tree_consistent(cluster: MetaCluster, postgres_url: str) -> None:
    folder = cluster.storage.folder
    metas = [meta_process(folder, f"pgmeta{i}", mgmtd_address=cluster.mgmtd, cluster_token=CLUSTER_TOKEN,
                          database_url=postgres_url, background_interval_s=0.3) for i in (1, 2)]  # fmt: skip
    engine = sa.create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        for m in metas:
            m.start()

        async def ready() -> None:
            await asyncio.gather(*(m.ready() for m in metas))

        asyncio.run(ready())
        # Inode ids of their own: these instances share the storage cluster with the SQLite meta of the
        # other tests, and chunk ids are (inode, index), so the two id ranges must not overlap.
        with engine.begin() as conn:
            conn.execute(sa.update(counters).where(counters.c.name == "next_inode_id").values(value=1 << 40))
        clients = [hf3fs.connect(cluster.mgmtd, cluster.tokens["alice"], meta_addresses=[m.address]) for m in metas]
        try:
            clients[0].makedirs("/c/a/x")
            clients[1].makedirs("/c/b/y")
            stop = threading.Event()
            done: Counter[str] = Counter()
            threads = [threading.Thread(target=_worker, args=(fs, i * 10 + j, stop, done))
                       for i, fs in enumerate(clients) for j in range(THREADS_PER_META)]  # fmt: skip
            for t in threads:
                t.start()
            # At least DURATION_S of racing, longer (up to MAX_DURATION_S) until enough succeeded: on a loaded
            # machine 8 s held fewer than 100 successful operations
            start = time.monotonic()
            while time.monotonic() - start < DURATION_S or (
                not _enough(done) and time.monotonic() - start < MAX_DURATION_S
            ):
                time.sleep(0.1)
            stop.set()
            for t in threads:
                t.join(timeout=60)
            assert _enough(done), done
        finally:
            for fs in clients:
                fs.close()
        counts = check_tree(engine)
        assert counts["inodes"] > 5, counts
        # A client that knows both instances carries on when one of them stops (meta is stateless).
        with hf3fs.connect(cluster.mgmtd, cluster.tokens["alice"], meta_addresses=[m.address for m in metas]) as fs:
            fs.makedirs("/c/failover", exist_ok=True)
            metas[0].stop()
            for i in range(10):
                fs.create(f"/c/failover/f{i}")
            assert fs.listdir("/c/failover") == [f"f{i}" for i in range(10)]
            # Quotas and write sessions on PostgreSQL too (their statements share the SQLite fast path's SQL).
            with hf3fs.connect(cluster.mgmtd, cluster.tokens["root"], meta_addresses=[metas[1].address]) as admin:
                admin.set_quota("/c/failover", max_bytes=1 << 20, max_inodes=100)
            with fs.open("/c/failover/w", "wb") as f:
                f.write(b"q" * 1000)
                assert fs.stat("/c/failover/w").write_sessions == 1
            assert fs.stat("/c/failover/w").size == 1000 and fs.stat("/c/failover/w").write_sessions == 0
            quota = fs.get_quota("/c/failover")
            assert quota is not None and quota.used_inodes == 12 and quota.used_bytes == 1000, quota
        check_tree(engine)
    finally:
        engine.dispose()
        for m in metas:
            m.stop()
