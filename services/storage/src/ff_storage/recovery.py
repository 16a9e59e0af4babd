"""Recovery and repair: a predecessor syncs a returning target; the head rewrites a damaged chunk everywhere.

A serving predecessor syncs a returning target: dump its chunk metadata, diff by the digest's rules,
full-chunk replaces under the chunk lock, then sync-done. The head rewrites a damaged chunk from a good copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.datapath import DataPathError
from ff_fsprotocol.routing import Chain
from ff_fsprotocol.routing import Target as RoutingTarget
from ff_rpc import RpcError
from ff_storage.core.chunks import (
    ChunkKey,
    ChunkMeta,
    check_chunk_id,
    sync_diff,
)
from ff_storage.core.errors import ChunkCorrupt, InvalidRequest
from ff_storage.core.requests import ReadIO, RepairRequest, UpdateKind
from ff_storage.core.results import IoStatus, UpdateResult
from ff_storage.core.target_role import Public
from ff_storage.node_state import NodeState, Target, Update, result_of
from ff_storage.peers import Peers

logger = logging.getLogger(__name__)

SYNC_BATCH = 16


class Recovery:
    """Repair and sync of one node's targets (see the module doc)."""

    def __init__(self, state: NodeState, peers: Peers) -> None:
        self.state, self.peers = state, peers
        self._syncing: set[tuple[int, int, int]] = set()  # (chain, target synced, chain version) under way

    # ---- repair ----

    async def request_repair(self, target: Target, keys: list[ChunkKey]) -> None:
        """Ask the chain's head to rewrite these chunks everywhere from a good copy."""
        chain = self.state.view.chain(target.record.chain_id) if self.state.view else None
        if chain is None or not chain.targets:
            return
        request = RepairRequest(chain_id=chain.chain_id, chain_version=chain.version, keys=tuple(keys))
        try:
            if chain.targets[0].node_id == self.state.node_id:
                await self.repair(request)
            else:
                await self.peers.repair_chunks(chain.targets[0].node_id, request)
            logger.warning("repaired chunk(s) %s of chain %d", keys, chain.chain_id)
        except Exception:
            logger.exception("repair of %s failed", keys)

    async def repair(self, request: RepairRequest) -> list[UpdateResult]:
        """Head: rewrite each chunk here and on every serving replica from a good copy (RepairChunks).

        Raises:
            TooCostly: more chunk ids than ``max_batch_ios``.
            InvalidRequest: a chunk id is out of range or repeated, or this node holds no target of the chain.
        """
        self.state.check_count("chunk ids", len(request.keys))
        keys = [check_chunk_id(*key) for key in request.keys]
        if len(set(keys)) != len(keys):
            raise InvalidRequest("a chunk id is repeated")
        target = self.state.target_of_chain(request.chain_id)
        if target is None:
            raise InvalidRequest(f"no target of chain {request.chain_id} on this node")
        pos = self.state.position(target)
        if pos is None or pos[1] != 0:
            raise InvalidRequest(f"target {target.target_id} is not the head of chain {request.chain_id}")
        results: list[UpdateResult] = []
        for key in keys:  # each to its end, as a chain update, even if the caller goes away meanwhile
            await self.state.update_to_the_end(
                target.target_id, [key], functools.partial(self._repair_into, results, target, key)
            )
        return results

    async def _repair_into(self, results: list[UpdateResult], target: Target, key: ChunkKey) -> None:
        """Repair ``key`` with its lock held, if ``target`` still heads its chain (as when it asked for the lock).

        A head taken out of its chain while it waited must not send its copy: the new head may have newer versions
        (and the replicas take a copy only from a serving target ahead of them, as their routing has it).
        """
        pos = self.state.position(target)
        if pos is None or not self.state.heads(target):
            results.append(
                result_of(IoStatus.TARGET_NOT_SERVING, f"target {target.target_id} no longer heads its chain")
            )
            return
        results.append(await self._repair_one(target, pos[0], key))

    async def _repair_one(self, target: Target, chain: Chain, key: ChunkKey) -> UpdateResult:
        meta = target.engine.get(key)
        if meta is None or not meta.committed_version:
            return result_of(IoStatus.CHUNK_NOT_FOUND, "head has no committed copy")
        own_bad = False
        try:
            got = await asyncio.to_thread(target.engine.read_committed, key)
            content = got[1] if got else b""
        except ChunkCorrupt:
            own_bad, content = True, b""
            for other in chain.targets[1:]:
                if Public(other.public_state) is not Public.SERVING:
                    continue
                read = ReadIO(
                    chain_id=chain.chain_id, chain_version=chain.version, key=key, offset=0, length=meta.length
                )
                with contextlib.suppress(RpcError, ConnectionError):
                    r = await self.peers.read_inline(other.node_id, read)
                    data = r.inline_data or b""
                    if r.status is IoStatus.OK and crc32c_of(data) == meta.checksum:
                        content = data
                        break
            else:
                return result_of(IoStatus.CHECKSUM_MISMATCH, "no good copy found")
        up = self._full_replace(target, key, meta, content)
        if own_bad:
            await asyncio.to_thread(_rewrite, target, up, content)
        refused = []  # the serving replicas that did not take the good copy: each with why
        for other in chain.targets[1:]:
            if Public(other.public_state) is Public.SERVING:
                try:
                    sent = self.peers.send_updates(chain, other, [up], set(), target.target_id, no_forward=True)
                    [answer] = await sent
                except (RpcError, ConnectionError, OSError, DataPathError) as exc:
                    refused.append(f"target {other.target_id}: {exc}")
                    continue
                if answer.status != IoStatus.OK:
                    refused.append(f"target {other.target_id}: {answer.status.name} {answer.message}".rstrip())
        if refused:  # the head's copy is good; the chain's is not yet
            message = f"the head's copy is good, not every replica's: {'; '.join(refused)}"
            return result_of(IoStatus.FORWARD_FAILED, message, meta.committed_version, target.engine.get(key))
        return result_of(IoStatus.OK, "repaired", meta.committed_version, target.engine.get(key))

    async def repair_locked(self, target: Target, key: ChunkKey) -> bool:
        """Repair one chunk whose lock the caller holds, if ``target`` is its chain's head; whether it is good now."""
        pos = self.state.position(target)
        if pos is None or pos[1] != 0:
            return False
        result = await self._repair_one(target, pos[0], key)
        logger.warning("repaired chunk %s of chain %d before an update: %s", key, pos[0].chain_id, result.message)
        return result.status in (IoStatus.OK, IoStatus.FORWARD_FAILED)  # the head's own copy is good: go on

    @staticmethod
    def _full_replace(target: Target, key: ChunkKey, meta: ChunkMeta, content: bytes) -> Update:
        """The committed chunk as a full-chunk replace, with its remembered updates (recovery, repair)."""
        last = target.engine.update_at(key, meta.committed_version)
        return Update(
            key=key,
            kind=UpdateKind.WRITE,
            chunk_size=max(1, meta.length),
            data=content,
            content=content,
            length=len(content),
            full=True,
            version=meta.committed_version,
            chain_version=meta.chain_version,
            update_id=last.update_id if last else None,
            records=target.engine.recent_updates(key),
        )

    # ---- recovery ----

    def dump_chunk_meta(self, target_id: int) -> list[ChunkMeta]:
        """Every chunk's metadata on the target, for the predecessor's recovery diff; TargetNotFound if absent."""
        return self.state.get_target(target_id).engine.all_metas()

    def complete_sync(self, target_id: int, chain_version: int) -> None:
        """The predecessor finished syncing the target: it reports up to date from now on.

        Raises:
            TargetNotFound: the target is not on this node.
            InvalidRequest: the target is not syncing, or its chain is not at ``chain_version`` here (the sender's
                routing is not this node's: a predecessor taken out of the chain, or one of the two behind).
        """
        target = self.state.get_target(target_id)
        if target.role.public is not Public.SYNCING:
            raise InvalidRequest(f"target {target_id} is not syncing")
        pos = self.state.position(target)
        if pos is None or pos[0].version != chain_version:
            here = pos[0].version if pos else None
            raise InvalidRequest(f"target {target_id}: its chain is at version {here} here, not {chain_version}")
        target.role.sync_done(chain_version)
        logger.info("target %d: sync done at chain version %d", target_id, chain_version)

    async def sync_loop(self, stop: asyncio.Event, interval_s: float) -> None:
        """Start a sync for every chain where this node's serving target precedes a syncing one."""
        while not stop.is_set():
            for target, chain, nxt, job in self.due_syncs():
                self._syncing.add(job)
                self.state.spawn(self._sync(target, chain, nxt, job))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    def due_syncs(self) -> list[tuple[Target, Chain, RoutingTarget, tuple[int, int, int]]]:
        """The syncs to start now: (this node's target, its chain, the syncing target after it, the job's key).

        Only from a target that serves for real: publicly serving, its lease held, not in recovery itself (a local
        write failed, or its lease lapsed: its copy may be behind, and a sync's copy replaces whatever is there).
        """
        due = []
        for target in list(self.state.targets.values()):
            succ = self.state.successor(target)
            if succ is None or not target.role.may_read(self.state.lease_ok):
                continue
            chain, nxt = succ
            if nxt is None:
                continue
            job = (chain.chain_id, nxt.target_id, chain.version)
            if Public(nxt.public_state) is Public.SYNCING and job not in self._syncing:
                due.append((target, chain, nxt, job))
        return due

    async def _sync(self, target: Target, chain: Chain, nxt: RoutingTarget, job: tuple[int, int, int]) -> None:
        try:
            logger.info(
                "syncing target %d from %d (chain %d v%d)",
                nxt.target_id,
                target.target_id,
                chain.chain_id,
                chain.version,
            )
            remote = await self.peers.chunk_metas(chain, nxt, timeout_s=60)
            # Updates that began before this node saw the target syncing may have found no successor and commit
            # here without passing their chunk on, after a look at the committed chunks now: the plan must see them.
            if not await self.state.settle_updates():
                raise RuntimeError("chain updates begun before the sync are still running")
            plan = sync_diff(target.engine.committed_metas(), remote)
            keys = plan.transfer + plan.remove
            removed = 0
            for i in range(0, len(keys), SYNC_BATCH):
                removed += await self._sync_batch(target, chain, nxt, keys[i : i + SYNC_BATCH])
            await self.peers.complete_sync(self._still_syncing(target, nxt), nxt)
            logger.info("synced target %d: %d transferred, %d removed", nxt.target_id, len(keys) - removed, removed)
        except Exception as exc:
            logger.warning("sync of target %d failed (will retry): %s", nxt.target_id, exc)
            await asyncio.sleep(0.5)
            self._syncing.discard(job)

    def _still_syncing(self, target: Target, nxt: RoutingTarget) -> Chain:
        """The chain as routing has it now, if ``target`` still serves and precedes ``nxt`` (the end of its sync).

        A sync's CompleteSync names the chain's version now, not the one its sync began at: the receiver takes it only
        for its own version, and a chain that changes more often than a sync takes (another target of it crash-looping)
        would keep the target syncing. What changed meanwhile did not change who syncs it: every update since went to
        it as a full replace.

        Raises:
            RuntimeError: ``target`` no longer serves, or another target follows it now.
        """
        now = self.state.successor(target)
        if now is None or now[1] is None or now[1].target_id != nxt.target_id:
            raise RuntimeError(f"target {nxt.target_id} no longer follows target {target.target_id}")
        if not target.role.may_read(self.state.lease_ok):
            raise RuntimeError(f"target {target.target_id} no longer serves")
        return now[0]

    async def _sync_batch(self, target: Target, chain: Chain, nxt: RoutingTarget, keys: list[ChunkKey]) -> int:
        """Make ``keys`` on ``nxt`` what they are here now; returns the number of removals.

        Each chunk's committed copy goes as a full replace, or a removal if this target has none. Decided under
        the chunks' locks, from
        this target's state at that moment, not from the plan: a write may have committed a chunk the plan saw
        only as pending at the syncing target (listed for removal), and that write may be acknowledged by now.
        """
        async with self.state.locks.hold(target.target_id, keys):
            ups = []
            for key in keys:
                got = await asyncio.to_thread(target.engine.read_committed, key)
                if got is None:
                    ups.append(
                        Update(
                            key=key,
                            kind=UpdateKind.REMOVE,
                            chunk_size=0,
                            full=True,
                            version=2**62,
                            chain_version=chain.version,
                        )
                    )
                    continue
                meta, content = got
                ups.append(self._full_replace(target, key, meta, content))
            answers = await self.peers.send_updates(chain, nxt, ups, set(), target.target_id, no_forward=True)
            bad = [r for r in answers if r.status != IoStatus.OK]
            if bad:
                raise RuntimeError(f"{len(bad)} sync write(s) refused: {bad[0].message}")
        return sum(u.kind is UpdateKind.REMOVE for u in ups)


def _rewrite(target: Target, up: Update, content: bytes) -> None:
    """Store ``content`` as ``up``'s version of its chunk and commit it; a failed commit leaves nothing pending."""
    engine = target.engine
    pend = engine.write_pending([(up.key, up.version, up.chain_version, content, None)])
    try:
        engine.commit(pend, [(up.update_id, up.records)])
    except BaseException:
        engine.abort(pend)
        raise
