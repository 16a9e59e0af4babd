"""File operators: open, create, close, sync, truncate, sessions.

File operators: Create and Open (with their write sessions and O_TRUNC), Close and Sync (the exact length
from storage), Truncate, session renewal and quota reservations, and their batches.

Each owns its flow: checks and transactions through ``MetaStore``, storage calls (``StorageChunks``) between
them, never inside one (a transaction may run again).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence

from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.model import NO_LIMIT, Inode, PathAt, QuotaRow, SessionInfo
from ff_meta.core.perms import Caller
from ff_meta.core.quota import quota_room
from ff_meta.ops.shared import SYSTEM, Shared
from ff_meta.ops.types import Capability, CloseArgs, CreateArgs, OpenArgs, Opened
from ff_meta.store.fsops import files, sessions
from ff_meta.store.tx import Tx

logger = logging.getLogger(__name__)

# How many times a Close or Sync asks storage for the file's length while truncates keep coming in between
_STORAGE_ASKS = 8

# Create's transaction: inode, created, write session, (room, folder) of the tightest byte quota over it or None
CreateDone = tuple[Inode, bool, SessionInfo | None, tuple[int, int] | None]


class FileOps:
    """Opening, creating, closing, syncing and truncating files."""

    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self._store = shared.store

    # ---- create and open ----

    async def create(self, caller: Caller, args: CreateArgs) -> Opened:
        """Create a file or open the existing one.

        One transaction; O_TRUNC of a file with data takes storage and two more).
        """
        body = await self._create_body(args)
        return await self._create_finish(caller, args, await self._store.write(caller, body))

    async def batch_create(self, caller: Caller, items: Sequence[CreateArgs | FsError]) -> list[Opened | FsError]:
        """Many ``create``, each alone.

        Each item as ``create`` by the same caller, in order (a later item sees an earlier one), each in a
        savepoint of a few shared transactions (``MetaStore.write_many``): one failing changes nothing. An
        FsError given in place of an item is its answer.
        """
        prepared: list[tuple[CreateArgs, Callable[[Tx], CreateDone]] | FsError] = []
        for item in items:
            try:
                prepared.append(item if isinstance(item, FsError) else (item, await self._create_body(item)))
            except FsError as err:
                prepared.append(err)
        ran = iter(await self._store.write_many(caller, [p[1] for p in prepared if not isinstance(p, FsError)]))
        out: list[Opened | FsError] = []
        for p in prepared:
            got = p if isinstance(p, FsError) else next(ran)
            if isinstance(got, FsError):
                out.append(got)
                continue
            assert not isinstance(p, FsError)  # (its answer was that error)
            try:
                out.append(await self._create_finish(caller, p[0], got))
            except FsError as err:
                out.append(err)
        return out

    async def _create_body(self, args: CreateArgs) -> Callable[[Tx], CreateDone]:
        """Create's transaction body, with what it needs from outside the store fetched first."""
        defaults = await self._s.defaults()
        inode_id = (await self._s.ids.take(1))[0]
        expires = self._s.lease_expiry()
        mode = args.mode if args.set_mode is None else args.set_mode

        def body(t: Tx) -> CreateDone:
            session = (args.session_id, args.client_id) if args.write else ("", "")
            inode, created, chain = files.create(
                t, args.path, mode, args.exclusive, args.write, args.layout, inode_id, defaults, session
            )
            if args.expect_inode_id and (created or inode.inode_id != args.expect_inode_id):  # (creates nothing)
                raise fs_error(FsCode.STALE, f"{args.path.path} is no longer the file {args.expect_inode_id}")
            if args.set_mode is not None and not created:
                inode = files.chmod_opened(t, inode, args.set_mode, args.path.path)
            sess = None
            if args.write and not (args.truncate and not created and inode.length):
                sess = sessions.open_session(t, inode, chain, args.session_id, args.client_id, defaults, expires)
                sess = _reserved(t, sess, args.reserve_bytes)
            return inode, created, sess, quota_room(chain, reserved=args.reserve_bytes if sess is not None else 0)

        return body

    async def _create_finish(self, caller: Caller, args: CreateArgs, done: CreateDone) -> Opened:
        """After Create's transaction: O_TRUNC of an existing file with data (storage first), the answer."""
        inode, created, sess, room = done
        if args.write and sess is None:  # O_TRUNC of an existing file with data: chunks go first, then the session
            await self.truncate(caller, args.path, 0, "")
            inode, chain = await self._store.write(caller, lambda t: files.open_file(t, args.path, True, False))
            if args.expect_inode_id and inode.inode_id != args.expect_inode_id:  # renamed in between
                raise fs_error(FsCode.STALE, f"{args.path.path} is no longer the file {args.expect_inode_id}")
            sess, inode = await self._open_session(caller, inode, chain, args.session_id, args.client_id)
            if args.reserve_bytes > sess.write_limit:
                opened = sess
                sess = await self._store.write(caller, lambda t: _reserved(t, opened, args.reserve_bytes))
        return Opened(
            inode=inode,
            session=sess,
            capability=self._s.capability(inode, args.write, sess.write_limit if sess is not None else NO_LIMIT),
            created=created,
            quota_room=room,
        )

    async def open(self, caller: Caller, args: OpenArgs) -> Opened:
        """Open a file (a read on the fast path; a write opens a session; O_TRUNC empties it first)."""
        held = False  # the write session named allows the open (``files.held_by_session``): it must exist still
        if args.write:
            inode, chain, held = await self._store.write(caller, functools.partial(_open_for_write, args))
        else:
            inode, chain = await self._store.read(caller, lambda t: files.open_file(t, args.path, False, args.read))
        if inode.is_dir:
            return Opened(inode=inode)
        if args.truncate and inode.length:
            await self.truncate(caller, args.path, 0, "")
            inode, chain = await self._store.write(
                caller, lambda t: files.open_file(t, args.path, args.write, args.read)
            )
        session = None
        if args.write:
            session, inode = await self._open_session(
                caller, inode, chain, args.session_id, args.client_id, must_exist=held
            )
        limit = session.write_limit if session is not None else NO_LIMIT
        return Opened(inode=inode, session=session, capability=self._s.capability(inode, args.write, limit))

    async def _open_session(
        self,
        caller: Caller,
        inode: Inode,
        chain: list[QuotaRow],
        session_id: str,
        client_id: str,
        *,
        must_exist: bool = False,
    ) -> tuple[SessionInfo, Inode]:
        """Open (or find again) a write session of the file: the session, and the inode as of that transaction.

        The inode is read again with the session: a session with a well-known id is hf3fs's append lease, and
        its holder writes at the length meta answers here. Read before the session (in the open's first
        transaction), it could miss the length the lease's previous holder closed with in between (its Close
        sets the length and ends the session in one transaction): two appenders at one offset.
        """
        defaults = await self._s.defaults()
        expires = self._s.lease_expiry()

        def body(t: Tx) -> tuple[SessionInfo, Inode]:
            now = t.get(inode.inode_id) or inode
            if must_exist and t.session_owner(session_id) is None:  # ended since: a new one needs the open's checks
                raise fs_error(FsCode.BAD_SESSION, f"write session {session_id} is closed or collected")
            return sessions.open_session(t, now, chain, session_id, client_id, defaults, expires), now

        return await self._store.write(caller, body)

    # ---- close, sync, truncate ----

    async def close(self, caller: Caller, args: CloseArgs) -> Inode:
        """End the write session with the file's exact length.

        Closing a closed (or collected) session succeeds; the length is still made exact (from storage only: the
        caller's hints count only through a live session).
        """
        try:
            return await self._finish(caller, args, close=True)
        except FsError as err:
            if err.fs_code is not FsCode.BAD_SESSION:
                raise
        return await self._finish(caller, CloseArgs(args.inode_id, "", 0, None), close=False)

    async def sync(self, caller: Caller, args: CloseArgs) -> Inode:
        """Make the file's length exact (storage's answer, the session's report), the session kept."""
        return await self._finish(caller, args, close=False)

    async def _finish(self, caller: Caller, args: CloseArgs, *, close: bool) -> Inode:
        """Close or Sync: a cursor read (on the loop on SQLite), storage's length (not for a writer's Sync), one write.

        A Sync with the writer's session takes the length it reports: its fsync needs its own bytes reachable, and
        those are in storage before it asks (the file never shrinks below what meta knew); the Close makes it exact
        from storage. One storage round trip less per fsync that grew a file (SQLite: two per transaction), and no
        read before its write: the write checks the session itself and, where its report does not count (its file was
        cut since), changes nothing and the Sync goes the Close's way. Storage is asked again where a truncate may
        have come between its answer and the write (``fsops.sessions.storage_answer_stands``).
        """
        if not close and args.session_id:
            reported = functools.partial(_finish, args, None, close=False, asked=None, reported_only=True)
            done = await self._store.write(caller, reported)
            if done is not None:
                return done
        for _ in range(_STORAGE_ASKS):
            inode, row, may_change = await self._store.read(
                caller, functools.partial(_authorize, args.inode_id, args.session_id)
            )
            if not may_change:  # a reader's fsync: nothing to make exact on its behalf
                return inode
            trusted = args.session_id and getattr(row, "truncated_at_ns", None) is None  # its report counts
            length = None if not close and trusted else await self._s.chunks.length(inode)
            done = await self._store.write(caller, functools.partial(_finish, args, length, close=close, asked=inode))
            if done is not None:
                return done
        raise fs_error(FsCode.BUSY, f"inode {args.inode_id} was truncated while its length was asked, again and again")

    async def batch_close(self, caller: Caller, items: Sequence[CloseArgs | FsError]) -> list[Inode | FsError]:
        """Many ``close``, each alone, storage asked once per chain.

        Many ``close``: each authorized and committed as that one would be, alone (one item's error fails only
        itself), with the lengths from ``StorageChunks.lengths`` (one storage round trip for the batch). An
        FsError given in place of an item is its answer.
        """
        out: list[Inode | FsError] = []
        todo: list[tuple[int, Inode, CloseArgs]] = []
        for item in items:
            if isinstance(item, FsError):
                out.append(item)
                continue
            try:
                inode, sid, may = await self._authorize_close(caller, item.inode_id, item.session_id)
            except FsError as err:
                out.append(err)
                continue
            out.append(inode)
            if may:
                todo.append(
                    (
                        len(out) - 1,
                        inode,
                        CloseArgs(item.inode_id, sid, item.written if sid else 0, item.mtime_ns if sid else None),
                    )
                )
        lengths = await self._s.chunks.lengths([inode for _, inode, _ in todo])
        finishes = [
            functools.partial(_finish, a, length, close=bool(a.session_id), asked=inode)
            for (_, inode, a), length in zip(todo, lengths, strict=True)
        ]
        for (k, _, a), got in zip(todo, await self._store.write_many(caller, finishes), strict=True):
            # None: a truncate came between storage's answer and the write; alone, it asks storage again
            out[k] = got if got is not None else await self._finish_alone(caller, a)
        return out

    async def _finish_alone(self, caller: Caller, args: CloseArgs) -> Inode | FsError:
        try:
            return await (self.close(caller, args) if args.session_id else self._finish(caller, args, close=False))
        except FsError as err:
            return err

    async def _authorize_close(self, caller: Caller, inode_id: int, session_id: str) -> tuple[Inode, str, bool]:
        """Who may close, and with which session.

        (inode, the session id that counts, whether the close may change the file): a session meta no longer
        knows counts as none (the length is then made exact from storage only), as in Close.
        """
        try:
            inode, _, may = await self._store.read(caller, functools.partial(_authorize, inode_id, session_id))
            return inode, session_id, may
        except FsError as err:
            if err.fs_code is not FsCode.BAD_SESSION:
                raise
        inode, _, may = await self._store.read(caller, functools.partial(_authorize, inode_id, ""))
        return inode, "", may

    async def truncate(self, caller: Caller, at: PathAt, length: int, session_id: str) -> Inode:
        """Set a file's length.

        Checked first (a cursor read); a shrink is noted (``fsops.files.record_truncate``), the chunks past the new end
        removed from storage, then the length committed with the note gone. A crash after storage was touched
        leaves the note, and ``finish_truncates`` completes the truncate: its file never stays at its old length
        with chunks missing.
        """
        inode = await self._store.read(caller, lambda t: files.truncate_check(t, at, session_id))
        cut = length < inode.length
        if not cut and await self._store.read(caller, lambda t: t.has_sessions(inode.inode_id)):
            # an open writer may have written past the new end without telling meta yet: storage knows
            cut = (await self._s.chunks.length(inode) or 0) > length
        if cut:
            await self._store.write(caller, lambda t: files.record_truncate(t, inode.inode_id, length))
            await self._s.chunks.remove_tail(inode, length, known_longer=True)
        return await self._store.write(caller, lambda t: files.truncate_commit(t, at, length, session_id, cut))

    async def finish_truncates(self) -> int:
        """Complete the truncates a crash cut short (noted over a lease ago, never committed): how many.

        Each is done again (storage's cut is idempotent) and committed, on the file by its inode id.
        """
        started_before_ns = time.time_ns() - int(self._s.options.lease_s * 1e9)
        todo = await self._store.read(SYSTEM, lambda t: files.pending_truncates(t, started_before_ns), small=False)
        for inode_id, length in todo:
            logger.warning("finishing a truncate of inode %d to %d bytes that a crash cut short", inode_id, length)
            try:
                await self.truncate(SYSTEM, PathAt(inode_id, ""), length, "")
            except FsError as err:
                if err.fs_code is not FsCode.NOT_FOUND:
                    raise
                await self._store.write(SYSTEM, lambda t, i=inode_id: files.forget_truncate(t, i))  # type: ignore[misc]
        return len(todo)

    # ---- sessions ----

    async def renew_sessions(
        self, caller: Caller, client_id: str, reports: Sequence[tuple[str, int, int]]
    ) -> tuple[float, list[str]]:
        """Renew a client's write sessions.

        Renew every write session of the client, adopting the lengths it reports (session id, inode id,
        written): (the lease, the sessions meta no longer knows).
        """
        expires = self._s.lease_expiry()
        lost = await self._store.write(caller, lambda t: sessions.renew(t, client_id, reports, expires))
        return self._s.options.lease_s, lost

    async def reserve_space(
        self, caller: Caller, inode_id: int, session_id: str, want: int, partial: bool
    ) -> tuple[int, int, Capability]:
        """Raise a write session's limit (quota reserved).

        Returns the limit, bytes the quotas would still grant, and a writable IoCapability up to the limit (storage
        refuses writes past the one a capability names).
        """
        limit, available = await self._store.write(
            caller, lambda t: sessions.reserve(t, inode_id, session_id, want, partial)
        )
        inode = await self._store.read(caller, lambda t: t.must(inode_id))
        return limit, available, self._s.capability(inode, True, limit)


def _authorize(inode_id: int, session_id: str, t: Tx) -> tuple[Inode, object, bool]:
    return sessions.authorize_finish(t, inode_id, session_id)


def _finish(
    args: CloseArgs, length: int | None, t: Tx, *, close: bool, asked: Inode | None, reported_only: bool = False
) -> Inode | None:
    return sessions.finish_length(
        t,
        args.inode_id,
        args.session_id,
        args.written,
        length,
        args.mtime_ns,
        close,
        asked=asked,
        reported_only=reported_only,
    )


def _open_for_write(args: OpenArgs, t: Tx) -> tuple[Inode, list[QuotaRow], bool]:
    """A write open's file and quota chain, and whether the write session it names allowed it."""
    held = None if args.read else files.held_by_session(t, args.path, args.session_id, args.client_id)
    if held is not None:
        return held, [], True
    return (*files.open_file(t, args.path, True, args.read), False)


def _reserved(t: Tx, sess: SessionInfo, reserve: int) -> SessionInfo:
    """The session with its quota reserved up to ``reserve`` (ReserveSpace in the same transaction)."""
    if reserve <= sess.write_limit:
        return sess
    limit, _ = sessions.reserve(t, sess.inode_id, sess.session_id, reserve)
    return dataclasses.replace(sess, write_limit=limit)
