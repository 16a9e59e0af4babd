"""Meta's background work, in every instance.

Write sessions whose lease lapsed are collected (the length made exact from storage), truncates a crash cut short are
finished, files a quota'd session closed with room left have their length asked again once its capabilities expired,
removed files' chunks are deleted (GC: once no writable capability for them can be left), the trash expires,
old records of calls done once go, SQLite's WAL is checkpointed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

from ff_meta.core.errors import FsError
from ff_meta.ops.admin import TrashOps
from ff_meta.ops.files import FileOps
from ff_meta.ops.shared import SYSTEM, Shared
from ff_meta.store import once, trash
from ff_meta.store.fsops import sessions
from ff_rpc import RpcError

logger = logging.getLogger(__name__)


class Background:
    """One round of each job every ``background_interval_s``, until stopped."""

    def __init__(self, shared: Shared, trash_ops: TrashOps, file_ops: FileOps) -> None:
        self._s = shared
        self._store = shared.store
        self._trash = trash_ops
        self._files = file_ops
        self._started = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        """Collect sessions, GC, expire the trash, prune, checkpoint; a failing job is logged and tried next round."""
        while not stop.is_set():
            for job in (
                self.collect_sessions,
                self.finish_truncates,
                self.recheck_lengths,
                self.run_gc,
                self.expire_trash,
                self.prune_once,
                self.checkpoint_wal,
            ):
                try:
                    await job()
                except Exception:
                    logger.exception("background %s failed", job.__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._s.options.background_interval_s)

    async def collect_sessions(self) -> int:
        """End the write sessions whose lease lapsed (client gone), each file's length made exact from storage.

        Not in this instance's first lease: while no instance answered (meta restarted), no client could renew,
        and each renews within a quarter lease of one answering again (as mgmtd gives every node a full lease when
        it takes over). A session collected first would end under its live writer: an open file it unlinked
        would go to GC, an append lease to another appender.
        """
        if time.monotonic() - self._started < self._s.options.lease_s:
            return 0
        expired = await self._store.read(SYSTEM, sessions.expired_sessions, small=False)
        done = 0
        for session_id, inode_id in expired:
            inode = await self._store.read(SYSTEM, lambda t, i=inode_id: t.get(i))  # type: ignore[misc]
            length = await self._s.chunks.length(inode) if inode is not None else None
            # not collected (a later round) where a truncate came between storage's answer and this write
            collect = functools.partial(sessions.collect_session, storage_length=length, asked=inode)
            if await self._store.write(SYSTEM, lambda t, s=session_id, c=collect: c(t, s)):  # type: ignore[misc]
                logger.info("collected write session %s of inode %d (lease lapsed)", session_id, inode_id)
                done += 1
        return done

    async def recheck_lengths(self) -> int:
        """Ask storage the length of files whose write session under a byte quota ended with room left.

        Once every capability of that session has expired (as GC waits): what a client wrote under one since counts.
        """
        ready_before = time.time() - 2 * self._s.options.writable_capability_ttl_s
        due = await self._store.read(
            SYSTEM, functools.partial(sessions.due_length_checks, ready_before=ready_before), small=False
        )
        done = 0
        for inode_id in due:
            inode = await self._store.read(SYSTEM, lambda t, i=inode_id: t.get(i))  # type: ignore[misc]
            length = await self._s.chunks.length(inode) if inode is not None else None
            adopt = functools.partial(sessions.adopt_checked_length, storage_length=length, asked=inode)
            if await self._store.write(SYSTEM, lambda t, i=inode_id, a=adopt: a(t, i)):  # type: ignore[misc]
                done += 1
        return done

    async def finish_truncates(self) -> int:
        """Complete the truncates a crash cut short (``FileOps.finish_truncates``)."""
        return await self._files.finish_truncates()

    async def prune_once(self) -> int:
        """Drop the records of calls done once older than a client retries (``store/once.py``), in batches."""
        pruned = 0
        while True:
            n = await self._store.write(SYSTEM, once.prune, small=False)
            pruned += n
            if n < once.PRUNE_BATCH:
                return pruned

    async def run_gc(self) -> int:
        """Remove the chunks of files whose last link went; a file leaves the queue only once storage did.

        Those done leave it together, in one write after the batch (a crash before it: storage is asked again, and
        removing chunks already gone is a no-op).
        """
        # Not before every writable capability given out for the file has expired, by twice their lifetime (a clock
        # of storage's behind meta's by less than one lifetime): a client holding one could still write chunks, which
        # nothing would ever remove, outside any quota.
        ready_before = time.time() - 2 * self._s.options.writable_capability_ttl_s
        jobs = await self._store.read(SYSTEM, functools.partial(trash.gc_batch, ready_before=ready_before), small=False)
        done: list[int] = []
        for job in jobs:
            try:
                await self._s.chunks.remove(
                    job.inode_id, job.chain_table_id, job.chain_begin, job.stripe_size, job.shuffle_seed
                )
            except (FsError, RpcError) as err:
                logger.warning("GC of inode %d failed (will retry): %s", job.inode_id, err)
                await self._store.write(SYSTEM, lambda t, i=job.inode_id: trash.gc_failed(t, i))  # type: ignore[misc]
                continue
            done.append(job.inode_id)
        if done:
            await self._store.write(SYSTEM, functools.partial(trash.gc_done, inode_ids=done))
        return len(done)

    async def expire_trash(self) -> int:
        """Delete the expired trash entries."""
        return await self._trash.expire(SYSTEM)

    async def checkpoint_wal(self) -> int:
        """Copy SQLite's WAL back into the database (pages copied)."""
        return await self._store.checkpoint()
