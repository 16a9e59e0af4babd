"""Meta's application layer: transactions through the store, storage calls around them (exact lengths,
chunk removal), inode id blocks, and the background work (session collection, GC, trash expiry)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from sqlalchemy.orm import Session

from ff_cluster import MgmtdClient
from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.lengths import LastChunk, file_end, on_every_chain
from ff_meta.core.model import Inode
from ff_meta.core.perms import Caller
from ff_meta.store import fsops, trash
from ff_meta.store.storage_space import StorageSpace
from ff_meta.store.tx import Defaults, LayoutSpec, NeedsOrm, NeedsThread, PathAt, Tx
from ff_rpc import RpcClient, RpcError
from ff_rpc.client import NO_RETRY, StubPool
from ff_store import Store, is_retryable
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1 import storage_pb2_grpc
from hf3fs.capability import capability_key, make_capability
from hf3fs.layout import file_chains
from hf3fs.routing import RoutingCache

logger = logging.getLogger(__name__)

T = TypeVar("T")
ID_BLOCK = 256
GROUP_WRITES = 64
# What a transaction may spend walking paths on the event loop (``Tx.loop_budget``: about 2,000 lookups, tens
# of milliseconds); past it, it runs again in a worker thread (NeedsThread).
LOOP_BUDGET_ROWS = 2048
LAST_CHUNK_QUERIES = 512  # files per QueryLastChunk call of ``storage_lengths``


def _authorize(inode_id: int, session_id: str, t: Tx) -> tuple[Inode, Any, bool]:
    return fsops.authorize_finish(t, inode_id, session_id)


def _finish(inode_id: int, session_id: str, written: int, length: int | None, mtime_ns: int | None, t: Tx) -> Inode:
    return fsops.finish_length(t, inode_id, session_id, written, length, mtime_ns, close=bool(session_id))


class StorageUnavailable(FsError):
    """Storage could not answer (exact length, chunk removal): the call may be retried."""

    fs_code = FsCode.CONFLICT


@dataclass(frozen=True, kw_only=True)
class MetaOptions:
    cluster_token: str
    default_chain_table_id: int = 1
    default_chunk_size: int = 4 * 1024 * 1024
    default_stripe_size: int = 16
    lease_s: float = 30.0
    capability_ttl_s: float = 24 * 3600.0
    trash_retention_s: float = 3 * 24 * 3600.0
    capacity_bytes: int = 1 << 40  # StatFs's figure only while no storage target reports its disk
    background_interval_s: float = 1.0
    storage_timeout_s: float = 10.0
    sqlite_synchronous: Literal["FULL", "NORMAL"] = "NORMAL"  # checked by MetaSettings


class IdAllocator:
    """Inode ids in blocks from the counter row (a block per instance, so creates do not contend on it)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0

    def take_now(self, count: int = 1) -> list[int] | None:
        """Ids from the current block without touching the store, or None when the block is used up."""
        with self._lock:
            if self._end - self._next < count:
                return None
            first = self._next
            self._next += count
            return list(range(first, first + count))

    def take(self, count: int = 1) -> list[int]:
        with self._lock:
            if self._end - self._next < count:
                n = max(ID_BLOCK, count)
                self._next = self._store.run(lambda s: fsops.allocate_ids(s, n))
                self._end = self._next + n
            first = self._next
            self._next += count
            return list(range(first, first + count))


class MetaApp:
    def __init__(self, store: Store, mgmtd: MgmtdClient, options: MetaOptions) -> None:
        self.store = store
        self.options = options
        self.routing = RoutingCache(mgmtd)
        self.ids = IdAllocator(store)
        self._cap_key = capability_key(options.cluster_token)
        self._rpc = RpcClient(token=options.cluster_token, timeout_s=options.storage_timeout_s, retry=NO_RETRY)
        self._stubs = StubPool(storage_pb2_grpc.StorageServiceStub)
        self.space = StorageSpace(self.routing, self._rpc, self._stubs)
        self._inline_reads = store.engine.dialect.name == "sqlite"
        self._write_lock = threading.Lock()
        self._write_queue: list[tuple[Callable[[Session], Any], asyncio.Future[Any]]] = []
        self._writer_busy = False
        self._writer_task: asyncio.Task[None] | None = None
        self._db_file = store.engine.url.database or ""
        self._reader: sqlite3.Connection | None = None
        self._writer: sqlite3.Connection | None = None
        self._checkpointer: sqlite3.Connection | None = None
        if self._inline_reads and self._db_file:
            self._reader = sqlite3.connect(self._db_file, isolation_level=None, check_same_thread=False)
            self._reader.execute("PRAGMA query_only = ON")
            # Inline writes only where a commit does not fsync (FULL: the group writer's thread pays it).
            if options.sqlite_synchronous == "NORMAL":
                self._writer = self._open_writer()

    def _open_writer(self) -> sqlite3.Connection:
        """The inline writer: it never waits for SQLite's lock (busy timeout 0: when another writer holds it,
        the write queues for the group writer's thread instead of stalling the event loop) and never
        checkpoints the WAL (that fsyncs; ``checkpoint_wal`` does it off the loop)."""
        writer = sqlite3.connect(self._db_file, isolation_level=None, check_same_thread=False, timeout=0)
        writer.execute("PRAGMA foreign_keys = ON")
        writer.execute("PRAGMA synchronous = NORMAL")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        return writer

    async def close(self) -> None:
        await self._stubs.close()
        for conn in (self._reader, self._writer, self._checkpointer):
            if conn is not None:
                conn.close()

    # ---- transactions ----

    async def tx(self, caller: Caller, fn: Callable[[Tx], T], *, read_only: bool = False, small: bool = True) -> T:
        """``fn`` in one transaction, never holding the event loop for long: on SQLite a ``small`` call (a few
        indexed statements, well under a millisecond) runs on the loop; anything else (large calls, and every
        call on PostgreSQL, whose statements wait for the network and for locks) in a worker thread."""
        now = time.time_ns()

        def body(session: Session) -> T:
            return fn(Tx(session, caller, now))

        if read_only and self._inline_reads and small:
            # SQLite reads in WAL mode never wait for a lock and take well under a millisecond: run them on
            # the event loop instead of paying a worker-thread hop per call.
            with contextlib.suppress(NeedsThread):
                return self.store.run(lambda s: fn(Tx(s, caller, now, loop_budget=LOOP_BUDGET_ROWS)), read_only=True)
            return await self.store.arun(body, read_only=True)
        if not read_only and self._inline_reads:
            if self._writer is not None and small:
                done, value = self._write_inline(caller, fn, now)
                if done:
                    return value  # type: ignore[return-value]
            return await self._group_write(body)  # type: ignore[no-any-return]
        return await self.store.arun(body, read_only=read_only)

    async def tx_many(self, caller: Caller, fns: Sequence[Callable[[Tx], T]]) -> list[T | FsError]:
        """Many small write calls (a BatchCreate's or BatchClose's items), in order, each as its own ``tx``
        would be: one that fails (an FsError) changes nothing and the others go on. On SQLite's inline writer
        they share transactions of up to ``GROUP_WRITES`` calls, a savepoint each (one commit per group instead
        of one per call); elsewhere, or when a group cannot run inline (the write lock taken, a call that needs
        the ORM), each goes through ``tx``."""
        out: list[T | FsError] = []
        for k in range(0, len(fns), GROUP_WRITES):
            group = fns[k : k + GROUP_WRITES]
            done, values = (self._write_inline_many(caller, group, time.time_ns()) if self._writer is not None
                            else (False, []))  # fmt: skip
            if done:
                out += values
                continue
            for fn in group:
                try:
                    out.append(await self.tx(caller, fn))
                except FsError as err:
                    out.append(err)
        return out

    def _write_inline_many(self, caller: Caller, fns: Sequence[Callable[[Tx], T]], now: int
                           ) -> tuple[bool, list[T | FsError]]:  # fmt: skip
        """``_write_inline`` for several calls, a savepoint each: ``(True, results)``, or ``(False, [])`` with
        nothing changed (the lock taken, a call needing the ORM: the caller runs them one by one)."""
        assert self._writer is not None
        cur = self._writer.cursor()
        try:
            try:
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                self._rollback()
                return False, []
            out: list[T | FsError] = []
            try:
                for fn in fns:
                    cur.execute("SAVEPOINT item")
                    try:
                        out.append(fn(Tx(None, caller, now, _cursor=cur, _qmark=True, loop_budget=LOOP_BUDGET_ROWS)))
                    except FsError as err:
                        cur.execute("ROLLBACK TO item")
                        out.append(err)
                    cur.execute("RELEASE item")
                cur.execute("COMMIT")
            except (NeedsOrm, sqlite3.OperationalError):
                self._rollback()
                return False, []
            except BaseException:
                self._rollback()
                raise
            return True, out
        finally:
            cur.close()

    def _write_inline(self, caller: Caller, fn: Callable[[Tx], T], now: int) -> tuple[bool, T | None]:
        """The write on the event loop, on the bare DB-API writer connection: ``(True, result)``; or
        ``(False, None)`` with nothing changed when SQLite's write lock is taken (by the group writer or another
        process) or the body needs the ORM session (quotas, sessions, trash): the caller queues it for the group
        writer. A failure of the body (an FsError) rolls back and is raised, as from ``Store.run``.

        On SQLite a short write transaction costs a few indexed statements and, in WAL mode with synchronous
        NORMAL, no fsync; the thread hop and ORM session of the queued path cost several times that."""
        assert self._writer is not None
        cur = self._writer.cursor()
        try:
            try:
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:  # SQLITE_BUSY: another writer holds the lock (or worse: see below)
                self._rollback()
                return False, None
            try:
                value = fn(Tx(None, caller, now, _cursor=cur, _qmark=True, loop_budget=LOOP_BUDGET_ROWS))
            except (NeedsOrm, sqlite3.OperationalError):
                self._rollback()  # the queued path runs it with the ORM, retries it, or reports the error
                return False, None
            except BaseException:
                self._rollback()
                raise
            try:
                cur.execute("COMMIT")
            except sqlite3.OperationalError:  # e.g. SQLITE_BUSY at commit outside WAL mode: retried queued
                self._rollback()
                return False, None
            return True, value
        finally:
            cur.close()

    def _rollback(self) -> None:
        """Leave the inline writer outside any transaction, reopening it if it cannot roll back."""
        assert self._writer is not None
        try:
            if self._writer.in_transaction:
                self._writer.execute("ROLLBACK")
        except sqlite3.Error:
            logger.warning("the inline SQLite writer could not roll back: reopening it", exc_info=True)
            with contextlib.suppress(sqlite3.Error):
                self._writer.close()
            self._writer = self._open_writer()

    async def _group_write(self, body: Callable[[Session], Any]) -> Any:
        """SQLite has one writer at a time, so the writes waiting in this process go together: one
        transaction (``Store.run``, re-run whole on conflict) with a savepoint per call, so that a call that
        fails (an FsError) changes nothing and the others still commit (group commit)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._write_queue.append((body, future))
        if not self._writer_busy:
            self._writer_busy = True
            self._writer_task = asyncio.create_task(self._drain_writes())
        return await future

    async def _drain_writes(self) -> None:
        try:
            while self._write_queue:
                batch, self._write_queue = self._write_queue[:GROUP_WRITES], self._write_queue[GROUP_WRITES:]
                try:
                    results = await asyncio.to_thread(self._write_batch, [b for b, _ in batch])
                except Exception as exc:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, fut), (ok, value) in zip(batch, results, strict=True):
                    if fut.done():
                        continue
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(value)
        finally:
            self._writer_busy = False

    def _write_batch(self, bodies: list[Callable[[Session], Any]]) -> list[tuple[bool, Any]]:
        def run_all(session: Session) -> list[tuple[bool, Any]]:
            out: list[tuple[bool, Any]] = []
            for body in bodies:
                savepoint = session.begin_nested()
                try:
                    value = body(session)
                except Exception as err:
                    if is_retryable(err):
                        raise  # the whole group runs again
                    savepoint.rollback()
                    out.append((False, err))
                    continue
                savepoint.commit()
                out.append((True, value))
            return out

        # Writers of this process queue here rather than in SQLite's busy handler, which sleeps in steps of
        # milliseconds (another process on the same file still meets the busy handler).
        with self._write_lock:
            if len(bodies) == 1:  # alone: its own transaction is its savepoint
                try:
                    return [(True, self.store.run(bodies[0]))]
                except Exception as err:
                    return [(False, err)]
            return self.store.run(run_all)

    async def read(self, caller: Caller, fn: Callable[[Tx], T], *, small: bool = True) -> T:
        """A read-only transaction for the hottest calls (stat, list, read opens). A ``small`` one on SQLite
        runs on the event loop, straight on one DB-API connection in WAL mode (a snapshot from BEGIN to COMMIT;
        the ORM session a ``Store.run`` sets up costs several times these few indexed lookups); ``fn`` may use
        only the ``Tx`` helpers that go through the cursor. Anything else (large batches; PostgreSQL, whose
        reads wait on the network) is an ordinary read-only ``Store.run`` in a worker thread."""
        if self._reader is not None and small:
            cur = self._reader.cursor()
            cur.execute("BEGIN")
            try:
                return fn(Tx(None, caller, time.time_ns(), _cursor=cur, _qmark=True, loop_budget=LOOP_BUDGET_ROWS))
            except NeedsOrm:  # NeedsThread: too long for the loop; run it again below
                pass
            finally:
                cur.execute("COMMIT")
                cur.close()
        return await self.store.arun(lambda s: fn(Tx(s, caller, time.time_ns())), read_only=True)

    async def defaults(self) -> Defaults:
        try:
            view = await self.routing.get()
        except RpcError as err:
            raise fs_error(FsCode.NO_SPACE, f"cannot reach mgmtd for the chain tables: {err}") from None
        if self.options.default_chain_table_id not in view.tables:
            view = await self.routing.refresh()
        tables = {t.table_id: (t.version, len(t.chain_ids)) for t in view.tables.values() if t.chain_ids}
        layout = LayoutSpec(self.options.default_chain_table_id, self.options.default_chunk_size,
                            self.options.default_stripe_size)  # fmt: skip
        return Defaults(layout, tables, self.options.lease_s)

    def capability(self, inode_id: int, writable: bool) -> tuple[bytes, int]:
        expires = time.time_ns() + int(self.options.capability_ttl_s * 1e9)
        return make_capability(self._cap_key, inode_id, writable, expires), expires

    def lease_expiry(self) -> float:
        return time.time() + self.options.lease_s

    # ---- storage ----

    async def _chains(self, table_id: int, begin: int, stripe: int, seed: int) -> list[int]:
        view = await self.routing.get()
        table = view.tables.get(table_id)
        if table is None or len(table.chain_ids) < stripe:
            view = await self.routing.refresh()
            table = view.tables.get(table_id)
        if table is None:
            raise StorageUnavailable(f"chain table {table_id} is unknown")
        return file_chains(list(table.chain_ids), begin, stripe, seed)

    async def _storage_call(self, chain_id: int, call: Callable[[storage_pb2_grpc.StorageServiceStub], Any],
                            build: Callable[[int], Any], *, head: bool, ok: Callable[[Any], bool]) -> Any:  # fmt: skip
        """One call to a serving target of the chain (its head for updates) built for the chain's current
        version; retried with fresh routing while it fails or ``ok(response)`` says the routing was stale."""
        last: object = None
        view = await self.routing.get()
        for attempt in range(8):
            if attempt:
                await asyncio.sleep(min(1.0, 0.05 * 2**attempt))
                view = await self.routing.refresh(force=True)
            chain = view.chain(chain_id)
            if chain is None:
                last = f"chain {chain_id} is unknown"
                continue
            targets = [view.head(chain_id)] if head else view.serving(chain_id)
            nodes = [view.node(t.node_id) for t in targets if t is not None]
            node = next((n for n in nodes if n is not None and n.grpc), None)
            if node is None:
                last = f"chain {chain_id} has no serving target"
                continue
            try:
                resp = await self._rpc.unary(call(self._stubs.get(node.grpc)), build(chain.version))
            except RpcError as err:
                last = err
                continue
            if ok(resp):
                return resp
            last = resp
        raise StorageUnavailable(f"storage did not answer for chain {chain_id}: {last}")

    async def storage_length(self, inode: Inode) -> int | None:
        """The file's exact length from storage: the end of its last chunk (None: no chunk at all)."""
        if not inode.is_file or not inode.chain_table_id or not inode.stripe_size:
            return None
        chains = await self._chains(inode.chain_table_id, inode.chain_begin, inode.stripe_size, inode.shuffle_seed)
        settled = {spb.CHUNK_IO_STATUS_OK, spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND}

        async def last_chunk(chain_id: int) -> LastChunk:
            def build(version: int) -> spb.QueryLastChunkRequest:
                q = spb.LastChunkQuery(chain_id=chain_id, chain_version=version, inode_id=inode.inode_id)
                return spb.QueryLastChunkRequest(queries=[q])

            resp = await self._storage_call(chain_id, lambda s: s.QueryLastChunk, build, head=False,
                                            ok=lambda r: r.results[0].status in settled)  # fmt: skip
            r = resp.results[0]
            return (r.last_chunk_index, r.last_chunk_length_bytes) if r.status == spb.CHUNK_IO_STATUS_OK else None

        return await file_end(chains, inode.chunk_size, last_chunk)

    async def storage_lengths(self, inodes: Sequence[Inode]) -> list[int | None]:
        """``storage_length`` of many files at once: one QueryLastChunk per chain (up to ``LAST_CHUNK_QUERIES``
        files each) for the whole batch, all chains at once, instead of one per file and chain."""
        per_chain: dict[int, list[int]] = {}  # chain -> inode ids asking it
        chains_of: list[list[int]] = []
        for inode in inodes:
            chains: list[int] = []
            if inode.is_file and inode.chain_table_id and inode.stripe_size:
                chains = list(dict.fromkeys(await self._chains(inode.chain_table_id, inode.chain_begin,
                                                               inode.stripe_size, inode.shuffle_seed)))  # fmt: skip
            chains_of.append(chains)
            for c in chains:
                per_chain.setdefault(c, []).append(inode.inode_id)
        settled = {spb.CHUNK_IO_STATUS_OK, spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND}
        answers: dict[tuple[int, int], LastChunk] = {}

        async def ask(chain_id: int, ids: list[int]) -> None:
            def build(version: int) -> spb.QueryLastChunkRequest:
                return spb.QueryLastChunkRequest(queries=[
                    spb.LastChunkQuery(chain_id=chain_id, chain_version=version, inode_id=i) for i in ids])  # fmt: skip

            resp = await self._storage_call(chain_id, lambda s: s.QueryLastChunk, build, head=False,
                                            ok=lambda r: all(x.status in settled for x in r.results))  # fmt: skip
            for i, r in zip(ids, resp.results, strict=True):
                ok = r.status == spb.CHUNK_IO_STATUS_OK
                answers[(chain_id, i)] = (r.last_chunk_index, r.last_chunk_length_bytes) if ok else None

        await asyncio.gather(*(ask(c, ids[k : k + LAST_CHUNK_QUERIES]) for c, ids in per_chain.items()
                               for k in range(0, len(ids), LAST_CHUNK_QUERIES)))  # fmt: skip
        out: list[int | None] = []
        for inode, chains in zip(inodes, chains_of, strict=True):
            found = [answers[(c, inode.inode_id)] for c in chains]
            ends = [i * inode.chunk_size + n for i, n in (a for a in found if a is not None)]
            out.append(max(ends) if ends else None)
        return out

    async def remove_chunks(self, inode_id: int, table_id: int, begin: int, stripe: int, seed: int,
                            from_chunk: int = 0) -> int:  # fmt: skip
        """Remove the file's chunks from ``from_chunk`` on, on every chain of its stripe at once."""
        chains = await self._chains(table_id, begin, stripe, seed)

        async def on_chain(chain_id: int) -> int:
            removed = 0
            while True:

                def build(version: int) -> spb.RemoveChunksRequest:
                    return spb.RemoveChunksRequest(chain_id=chain_id, chain_version=version, inode_id=inode_id,
                                                   begin_chunk_index=from_chunk)  # fmt: skip

                resp = await self._storage_call(chain_id, lambda s: s.RemoveChunks, build, head=True, ok=lambda r: True)
                removed += int(resp.num_removed)
                if not resp.has_more:
                    return removed

        return sum(await on_every_chain(chains, on_chain))

    async def truncate_chunk(self, inode: Inode, chunk_index: int, length: int) -> None:
        chains = await self._chains(inode.chain_table_id, inode.chain_begin, inode.stripe_size, inode.shuffle_seed)
        chain_id = chains[chunk_index % len(chains)]

        def build(version: int) -> spb.TruncateChunksRequest:
            return spb.TruncateChunksRequest(ios=[spb.TruncateIO(
                chain_id=chain_id, chain_version=version, chunk_size_bytes=inode.chunk_size, length_bytes=length,
                chunk_id=spb.ChunkId(inode_id=inode.inode_id, chunk_index=chunk_index))])  # fmt: skip

        done = {spb.CHUNK_IO_STATUS_OK, spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND}
        await self._storage_call(chain_id, lambda s: s.TruncateChunks, build, head=True,
                                 ok=lambda r: r.results[0].status in done)  # fmt: skip

    # ---- operations that need storage ----

    async def close_or_sync(self, caller: Caller, inode_id: int, session_id: str, written: int,
                            mtime_ns: int | None, close: bool) -> Inode:  # fmt: skip
        # a cursor read on the event loop (an ORM session in a worker thread only if the check needs one)
        inode, _, may_change = await self.read(caller, lambda t: fsops.authorize_finish(t, inode_id, session_id))
        if not may_change:  # a reader's fsync: nothing to make exact on its behalf
            return inode
        length = await self.storage_length(inode)
        return await self.tx(caller, lambda t: fsops.finish_length(t, inode_id, session_id, written, length,
                                                                   mtime_ns, close))  # fmt: skip

    async def batch_close(self, caller: Caller, items: Sequence[tuple[int, str, int, int | None]]
                          ) -> list[Inode | FsError]:  # fmt: skip
        """Many ``close_or_sync(..., close=True)`` (inode id, session id, written, mtime): each authorized and
        committed as that one would be, alone (one item's error fails only itself), with the lengths from
        ``storage_lengths`` (one storage round trip for the batch). A session meta no longer knows closes as
        Close does: the length made exact from storage only."""
        out: list[Inode | FsError] = []
        todo: list[tuple[int, Inode, str, int, int | None]] = []
        for inode_id, session_id, written, mtime in items:
            try:
                inode, sid, may = await self._authorize_close(caller, inode_id, session_id)
            except FsError as err:
                out.append(err)
                continue
            out.append(inode)
            if may:
                todo.append((len(out) - 1, inode, sid, written if sid else 0, mtime if sid else None))
        lengths = await self.storage_lengths([inode for _, inode, _, _, _ in todo])
        finishes = [functools.partial(_finish, inode.inode_id, sid, written, length, mtime)
                    for (_, inode, sid, written, mtime), length in zip(todo, lengths, strict=True)]  # fmt: skip
        for (k, _, _, _, _), got in zip(todo, await self.tx_many(caller, finishes), strict=True):
            out[k] = got
        return out

    async def _authorize_close(self, caller: Caller, inode_id: int, session_id: str) -> tuple[Inode, str, bool]:
        """(inode, the session id that counts, whether the close may change the file): a session meta no longer
        knows counts as none (the length is then made exact from storage only), as in Close."""
        try:
            inode, _, may = await self.read(caller, functools.partial(_authorize, inode_id, session_id))
            return inode, session_id, may
        except FsError as err:
            if err.fs_code is not FsCode.BAD_SESSION:
                raise
        inode, _, may = await self.read(caller, functools.partial(_authorize, inode_id, ""))
        return inode, "", may

    async def truncate(self, caller: Caller, at: PathAt, length: int, session_id: str) -> Inode:
        inode = await self.read(caller, lambda t: fsops.truncate_check(t, at, session_id))  # a cursor read
        if length < inode.length and inode.chain_table_id and inode.stripe_size:
            chunk, within = divmod(length, inode.chunk_size)
            first_gone = chunk + 1 if within else chunk
            await self.remove_chunks(inode.inode_id, inode.chain_table_id, inode.chain_begin, inode.stripe_size,
                                     inode.shuffle_seed, from_chunk=first_gone)  # fmt: skip
            if within:
                await self.truncate_chunk(inode, chunk, within)
        return await self.tx(caller, lambda t: fsops.truncate_commit(t, at, length, session_id))

    # ---- background ----

    async def background(self, stop: asyncio.Event) -> None:
        """Collect sessions whose lease lapsed, remove GC'd files' chunks, expire the trash; until stopped."""
        root = Caller(0, (0,), "meta", is_root=True)
        while not stop.is_set():
            for job in (self.collect_sessions, self.run_gc, self.expire_trash, self.checkpoint_wal):
                try:
                    await job(root)
                except Exception:
                    logger.exception("background %s failed", job.__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.options.background_interval_s)

    async def checkpoint_wal(self, _root: Caller) -> int:
        """Copy the SQLite WAL back into the database (the inline writer never does), in a worker thread: it
        fsyncs. PASSIVE: it waits for no reader or writer. Returns the pages copied (0 without inline writes)."""
        if self._writer is None:
            return 0

        def checkpoint() -> int:
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(self._db_file, isolation_level=None, check_same_thread=False)
            busy, _log, copied = self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            return int(copied) if not busy else 0

        return await asyncio.to_thread(checkpoint)

    async def collect_sessions(self, root: Caller) -> int:
        expired = await self.store.arun(lambda s: fsops.expired_sessions(s, time.time()), read_only=True)
        done = 0
        for session_id, inode_id in expired:
            inode = await self.tx(root, lambda t, i=inode_id: t.get(i), read_only=True)  # type: ignore[misc]
            length = await self.storage_length(inode) if inode is not None else None
            if await self.tx(root, lambda t, s=session_id, n=length: fsops.collect_session(t, s, n)):  # type: ignore[misc]
                logger.info("collected write session %s of inode %d (lease lapsed)", session_id, inode_id)
                done += 1
        return done

    async def run_gc(self, root: Caller) -> int:
        jobs = await self.store.arun(trash.gc_batch, read_only=True)
        done = 0
        for job in jobs:
            try:
                await self.remove_chunks(job.inode_id, job.chain_table_id, job.chain_begin, job.stripe_size,
                                         job.shuffle_seed)  # fmt: skip
            except (FsError, RpcError) as err:
                logger.warning("GC of inode %d failed (will retry): %s", job.inode_id, err)
                await self.store.arun(lambda s, i=job.inode_id: trash.gc_failed(s, i))  # type: ignore[misc]
                continue
            await self.store.arun(lambda s, i=job.inode_id: trash.gc_done(s, i))  # type: ignore[misc]
            done += 1
        return done

    async def expire_trash(self, root: Caller) -> int:
        ids = await self.tx(root, lambda t: trash.trash_ids(t, [], expired_only=True, everyone=True), read_only=True)
        for trash_id in ids:
            await self.delete_trash(root, trash_id, check_owner=False)
        return len(ids)

    async def delete_trash(self, caller: Caller, trash_id: str, *, check_owner: bool = True) -> bool:
        """Delete a trash entry in small transactions (each consistent on its own); False if not found."""
        if check_owner:
            await self.tx(caller, lambda t: trash.trash_row(t, trash_id), read_only=True)
        while True:
            _, done = await self.tx(caller, lambda t: trash.delete_trash_entry(t, trash_id))
            if done:
                return True

    async def empty_trash(self, caller: Caller, ids: Sequence[str], expired_only: bool) -> int:
        found = await self.tx(caller, lambda t: trash.trash_ids(t, ids, expired_only), read_only=True)
        n = 0
        for trash_id in found:
            try:
                await self.delete_trash(caller, trash_id)
            except FsError as err:
                if err.fs_code is not FsCode.NOT_FOUND:  # deleted meanwhile: fine
                    raise
                continue
            n += 1
        return n
