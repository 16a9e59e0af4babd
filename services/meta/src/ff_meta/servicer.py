"""Thin gRPC adapters: protobuf in, MetaApp/fsops calls, protobuf out. Errors map in ff_meta.errors."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import Callable
from typing import Any

from ff_meta.app import MetaApp
from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.model import Inode, InodeType
from ff_meta.core.paths import split_path
from ff_meta.core.perms import Caller, R, allowed
from ff_meta.store import fsops, trash
from ff_meta.store.fsops import AttrChange
from ff_meta.store.tx import LayoutSpec, PathAt, QuotaRow, SessionInfo, Tx
from ff_rpc import current_principal
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.meta.v1 import meta_pb2_grpc

Context = Any
# Create's transaction: inode, created, write session, (room, folder) of the tightest byte quota over it or None
CreateDone = tuple[Inode, bool, SessionInfo | None, tuple[int, int] | None]
DEFAULT_PAGE = 1000
MAX_PAGE = 10000
MAX_BATCH = 10000
MAX_WRITE_BATCH = 1024  # items of a BatchCreate or BatchClose (each a write transaction)
# Calls up to these sizes run on the event loop on SQLite (well under a millisecond); larger ones in a thread.
SMALL_BATCH = 64
SMALL_PAGE = 1000
SMALL_MKDIRS = 16
# Inode ids are positive and below 2^63 (the store's integers are signed 64-bit); lengths below 2^62.
MAX_INODE_ID = (1 << 63) - 1
MAX_LENGTH = 1 << 62
MAX_TRASH_IDS = 1000
MAX_RETENTION_S = 100 * 365 * 24 * 3600.0


def caller() -> Caller:
    p = current_principal()
    return Caller(uid=p.uid, gids=tuple(p.gids), name=p.name, is_root=p.is_admin)


def to_pb(inode: Inode, sessions: int = 0) -> pb.Inode:
    # A directory's stored count is 1 plus its subdirectories; it shows 2 plus them (its "." too); at least 2
    # for the folders made before the count was kept.
    nlink = max(2, inode.nlink + 1) if inode.is_dir else inode.nlink
    msg = pb.Inode(
        inode_id=inode.inode_id, type=pb.InodeType.ValueType(int(inode.type)), mode=inode.mode, uid=inode.uid,
        gid=inode.gid, nlink=nlink, atime_ns=inode.atime_ns, mtime_ns=inode.mtime_ns, ctime_ns=inode.ctime_ns,
        length_bytes=inode.length, parent_inode_id=inode.parent_id if inode.is_dir else 0,
        symlink_target=inode.symlink_target if inode.is_symlink else "", num_write_sessions=sessions, rdev=inode.rdev,
    )  # fmt: skip
    if inode.is_file or inode.is_dir:
        msg.layout.CopyFrom(pb.Layout(
            chain_table_id=inode.chain_table_id, chain_table_version=inode.chain_table_version,
            chunk_size_bytes=inode.chunk_size, stripe_size=inode.stripe_size, chain_begin_index=inode.chain_begin,
            shuffle_seed=inode.shuffle_seed,
        ))  # fmt: skip
    return msg


def inode_id_of(value: int) -> int:
    """An inode id from a request: one the store cannot hold names no inode (ENOENT), checked before any work."""
    if value > MAX_INODE_ID:
        raise fs_error(FsCode.NOT_FOUND, f"no inode {value} (inode ids are below 2^63)")
    return value


def length_of(value: int, what: str) -> int:
    if value >= MAX_LENGTH:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"{what} {value} is too large (at most 2^62 - 1)")
    return value


def at(msg: pb.PathAt) -> PathAt:
    return PathAt(inode_id_of(msg.parent_inode_id), msg.path)


def layout_of(msg: pb.Layout, present: bool) -> LayoutSpec | None:
    if not present:
        return None
    return LayoutSpec(msg.chain_table_id, msg.chunk_size_bytes, msg.stripe_size)


def session_pb(s: SessionInfo) -> pb.WriteSession:
    return pb.WriteSession(session_id=s.session_id, client_id=s.client_id, inode_id=s.inode_id,
                           write_limit_bytes=s.write_limit, lease_s=s.lease_s)  # fmt: skip


def quota_pb(q: QuotaRow, path: str) -> pb.DirQuota:
    return pb.DirQuota(inode_id=q.inode_id, path=path, max_bytes=q.max_bytes, max_inodes=q.max_inodes,
                       used_bytes=q.used_bytes + q.reserved_bytes, used_inodes=q.used_inodes,
                       reserved_bytes=q.reserved_bytes)  # fmt: skip


def page(size: int) -> int:
    return min(size or DEFAULT_PAGE, MAX_PAGE)


def token_after(token: str) -> str:
    if not token:
        return ""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise fs_error(FsCode.INVALID_ARGUMENT, "bad page_token") from None


def token_of(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode() if name else ""


READ, WRITE, RW = pb.OPEN_MODE_READ, pb.OPEN_MODE_WRITE, pb.OPEN_MODE_READ_WRITE


def open_mode_of(value: int, default: int) -> int:
    if value not in (pb.OPEN_MODE_UNSPECIFIED, READ, WRITE, RW):
        raise fs_error(FsCode.INVALID_ARGUMENT, f"unknown open_mode {value}")
    return value or default


class MetaServicer(meta_pb2_grpc.MetaServiceServicer):
    def __init__(self, app: MetaApp) -> None:
        self._app = app

    def _cap(self, inode: Inode, writable: bool) -> pb.IoCapability:
        token, expires = self._app.capability(inode.inode_id, writable)
        return pb.IoCapability(token=token, inode_id=inode.inode_id, writable=writable, expires_at_ns=expires)

    async def StatFs(self, request: pb.StatFsRequest, context: Context) -> pb.StatFsResponse:
        used, count = await self._app.store.arun(fsops.statfs, read_only=True)
        space = await self._app.space.get()
        if space is not None:
            cap, free = space.capacity_bytes, space.free_bytes
        else:  # no target reported its disk: the configured figure
            cap = self._app.options.capacity_bytes
            free = max(0, cap - used)
        return pb.StatFsResponse(capacity_bytes=cap, used_bytes=used, free_bytes=free, num_inodes=count)

    async def Stat(self, request: pb.StatRequest, context: Context) -> pb.StatResponse:
        where = at(request.path)
        inode, sessions = await self._app.read(
            caller(), lambda t: fsops.stat_with_sessions(t, where, request.follow_last_symlink)
        )
        return pb.StatResponse(inode=to_pb(inode, sessions))

    async def BatchStat(self, request: pb.BatchStatRequest, context: Context) -> pb.BatchStatResponse:
        if len(request.paths) > MAX_BATCH:
            raise fs_error(FsCode.INVALID_ARGUMENT, f"at most {MAX_BATCH} paths per BatchStat")
        c = caller()
        paths: list[PathAt | FsError] = []
        for p in request.paths:
            try:
                paths.append(at(p))
            except FsError as err:  # one bad entry fails only itself
                paths.append(err)
        results = await self._app.read(c, lambda t: fsops.batch_stat(t, paths, request.follow_last_symlink),
                                       small=len(paths) <= SMALL_BATCH)  # fmt: skip
        out = []
        caps: dict[int, pb.IoCapability] = {}  # one per file, however often it is asked for
        for r in results:
            if isinstance(r, FsError):
                out.append(pb.StatResult(error=pb.FsError.ValueType(int(r.fs_code))))
            else:
                item = pb.StatResult(inode=to_pb(r))
                if request.include_read_capability and r.is_file and allowed(c, r, R):
                    if r.inode_id not in caps:
                        caps[r.inode_id] = self._cap(r, False)
                    item.read_capability.CopyFrom(caps[r.inode_id])
                out.append(item)
        return pb.BatchStatResponse(results=out)

    async def _check_table(self, layout: LayoutSpec | None) -> None:
        """A layout naming a chain table that does not exist is a bad argument (not ENOSPC at the next create)."""
        if layout is None or not layout.chain_table_id:
            return
        tables = (await self._app.defaults()).tables
        if layout.chain_table_id not in tables:
            raise fs_error(FsCode.INVALID_ARGUMENT, f"chain table {layout.chain_table_id} does not exist; chain "
                                                    f"tables: {sorted(tables)}")  # fmt: skip

    async def _session(self, c: Caller, inode: Inode, chain: list[QuotaRow], session_id: str,
                       client_id: str) -> SessionInfo:  # fmt: skip
        defaults = await self._app.defaults()
        expires = self._app.lease_expiry()
        return await self._app.tx(c, lambda t: fsops.open_session(t, inode, chain, session_id, client_id, defaults,
                                                                  expires))  # fmt: skip

    async def Create(self, request: pb.CreateRequest, context: Context) -> pb.CreateResponse:
        c = caller()
        body = await self._create_body(request)
        return await self._create_finish(c, request, await self._app.tx(c, body))

    async def BatchCreate(self, request: pb.BatchCreateRequest, context: Context) -> pb.BatchCreateResponse:
        """Each item as Create by the same caller, in order (a later item sees an earlier one), each in a
        savepoint of a few shared transactions (``MetaApp.tx_many``): one failing changes nothing."""
        check_batch(len(request.creates), "BatchCreate")
        c = caller()
        bodies: list[Any] = []
        for item in request.creates:
            try:
                bodies.append(await self._create_body(item))
            except FsError as err:
                bodies.append(err)
        ran = iter(await self._app.tx_many(c, [b for b in bodies if not isinstance(b, FsError)]))
        out = []
        for item, body in zip(request.creates, bodies, strict=True):
            got = body if isinstance(body, FsError) else next(ran)
            try:
                if isinstance(got, FsError):
                    raise got
                out.append(pb.CreateResult(response=await self._create_finish(c, item, got)))
            except FsError as err:
                out.append(pb.CreateResult(error=pb.FsError.ValueType(int(err.fs_code)), message=str(err)))
        return pb.BatchCreateResponse(results=out)

    async def BatchClose(self, request: pb.BatchCloseRequest, context: Context) -> pb.BatchCloseResponse:
        check_batch(len(request.closes), "BatchClose")
        items = []
        for r in request.closes:
            mtime = r.mtime_ns if r.HasField("mtime_ns") else None
            # an id or length no store can hold: that item alone fails (as its Close would)
            items.append((min(r.inode_id, MAX_INODE_ID + 1), r.session_id, r.written_length_bytes, mtime))
        bad: dict[int, FsError] = {}
        for k, (inode_id, _, written, _) in enumerate(items):
            try:
                inode_id_of(inode_id)
                length_of(written, "written_length_bytes")
            except FsError as err:
                bad[k] = err
        good = [k for k in range(len(items)) if k not in bad]
        done = dict(zip(good, await self._app.batch_close(caller(), [items[k] for k in good]), strict=True))
        out = []
        for k in range(len(items)):
            got = bad.get(k) or done[k]
            if isinstance(got, FsError):
                out.append(pb.CloseResult(error=pb.FsError.ValueType(int(got.fs_code)), message=str(got)))
            else:
                out.append(pb.CloseResult(inode=to_pb(got)))
        return pb.BatchCloseResponse(results=out)

    async def _create_body(self, request: pb.CreateRequest) -> Callable[[Tx], CreateDone]:
        """Create's checks, and its transaction's body (run by ``tx`` or ``tx_many``)."""
        write = open_mode_of(request.open_mode, READ) in (WRITE, RW)
        reserve = length_of(request.reserve_bytes, "reserve_bytes")
        if reserve and not write:
            raise fs_error(FsCode.INVALID_ARGUMENT, "reserve_bytes needs a write mode")
        if request.truncate and not write:
            raise fs_error(FsCode.INVALID_ARGUMENT, "O_TRUNC needs a write mode")
        if write and (not request.session_id or not request.client_id):
            raise fs_error(FsCode.INVALID_ARGUMENT, "a write open needs a session_id and a client_id")
        defaults = await self._app.defaults()
        inode_id = (await _ids(self._app, 1))[0]
        layout = layout_of(request.layout, request.HasField("layout"))
        expires = self._app.lease_expiry()

        set_mode = request.set_mode if request.HasField("set_mode") else None

        expect = inode_id_of(request.expect_inode_id)

        def body(t: Tx) -> CreateDone:
            where = at(request.path)
            mode = request.mode if set_mode is None else set_mode
            inode, created, chain = fsops.create(t, where, mode, request.exclusive, write, layout, inode_id, defaults)
            if expect and (created or inode.inode_id != expect):  # (raised: the transaction creates nothing)
                raise fs_error(FsCode.STALE, f"{where.path} is no longer the file {expect}")
            if set_mode is not None and not created:
                inode = fsops.chmod_opened(t, inode, set_mode, where.path)
            sess = None
            if write and not (request.truncate and not created and inode.length):
                sess = fsops.open_session(t, inode, chain, request.session_id, request.client_id, defaults, expires)
                sess = _reserved(t, sess, reserve)
            return inode, created, sess, fsops.quota_room(chain, reserved=reserve if sess is not None else 0)

        return body

    async def _create_finish(self, c: Caller, request: pb.CreateRequest, done: CreateDone) -> pb.CreateResponse:
        """After Create's transaction: O_TRUNC of an existing file with data (storage first), the answer."""
        inode, created, sess, room = done
        write = open_mode_of(request.open_mode, READ) in (WRITE, RW)
        reserve = request.reserve_bytes
        if write and sess is None:  # O_TRUNC of an existing file with data: chunks go first, then the session
            await self._app.truncate(c, at(request.path), 0, "")
            inode, chain = await self._app.tx(c, lambda t: fsops.open_file(t, at(request.path), True, False))
            if request.expect_inode_id and inode.inode_id != request.expect_inode_id:  # renamed in between
                raise fs_error(FsCode.STALE, f"{request.path.path} is no longer the file {request.expect_inode_id}")
            sess = await self._session(c, inode, chain, request.session_id, request.client_id)
            if reserve > sess.write_limit:
                opened = sess
                sess = await self._app.tx(c, lambda t: _reserved(t, opened, reserve))
        resp = pb.CreateResponse(inode=to_pb(inode), created=created)
        if sess is not None:
            resp.session.CopyFrom(session_pb(sess))
        resp.io_capability.CopyFrom(self._cap(inode, write))
        if room is not None:
            resp.quota_room_bytes, resp.quota_inode_id = room
        return resp

    async def Mkdirs(self, request: pb.MkdirsRequest, context: Context) -> pb.MkdirsResponse:
        where = at(request.path)
        _, parts = _parts(where.path)
        layout = layout_of(request.layout, request.HasField("layout"))
        await self._check_table(layout)
        ids = await _ids(self._app, max(1, len(parts)))
        inode = await self._app.tx(caller(), lambda t: fsops.mkdirs(t, where, request.mode or 0o755,
                                                                    request.recursive, layout, ids),
                                   small=len(parts) <= SMALL_MKDIRS)  # fmt: skip
        return pb.MkdirsResponse(inode=to_pb(inode))

    async def Symlink(self, request: pb.SymlinkRequest, context: Context) -> pb.SymlinkResponse:
        ids = await _ids(self._app, 1)
        inode = await self._app.tx(caller(), lambda t: fsops.symlink(t, at(request.path), request.target, ids[0]))
        return pb.SymlinkResponse(inode=to_pb(inode))

    async def Mknod(self, request: pb.MknodRequest, context: Context) -> pb.MknodResponse:
        try:
            kind = InodeType(request.type)
        except ValueError:
            raise fs_error(FsCode.INVALID_ARGUMENT, f"unknown inode type {request.type}") from None
        ids = await _ids(self._app, 1)
        inode = await self._app.tx(caller(), lambda t: fsops.mknod(t, at(request.path), kind, request.mode,
                                                                   request.rdev, ids[0]))  # fmt: skip
        return pb.MknodResponse(inode=to_pb(inode))

    async def HardLink(self, request: pb.HardLinkRequest, context: Context) -> pb.HardLinkResponse:
        inode = await self._app.tx(caller(), lambda t: fsops.hardlink(t, at(request.old_path), at(request.new_path)))
        return pb.HardLinkResponse(inode=to_pb(inode))

    async def Remove(self, request: pb.RemoveRequest, context: Context) -> pb.RemoveResponse:
        retention = request.trash_retention_s or self._app.options.trash_retention_s
        if not 0 <= retention <= MAX_RETENTION_S:  # NaN fails too
            raise fs_error(FsCode.INVALID_ARGUMENT, f"trash_retention_s must be from 0 to {MAX_RETENTION_S:.0f}")
        trash_id = trash.new_trash_id()
        expect_dir = request.expect_directory if request.HasField("expect_directory") else None
        out = await self._app.tx(caller(), lambda t: fsops.remove(t, at(request.path), request.recursive,
                                                                  request.to_trash, retention, trash_id,
                                                                  expect_dir))  # fmt: skip
        return pb.RemoveResponse(trash_id=out)

    async def Open(self, request: pb.OpenRequest, context: Context) -> pb.OpenResponse:
        c = caller()
        mode = open_mode_of(request.open_mode, READ)
        write, read = mode in (WRITE, RW), mode in (READ, RW)
        if request.truncate and not write:
            raise fs_error(FsCode.INVALID_ARGUMENT, "O_TRUNC needs a write mode")
        if write and (not request.session_id or not request.client_id):
            raise fs_error(FsCode.INVALID_ARGUMENT, "a write open needs a session_id and a client_id")
        where = at(request.path)
        if write:
            inode, chain = await self._app.tx(c, lambda t: fsops.open_file(t, where, write, read))
        else:
            inode, chain = await self._app.read(c, lambda t: fsops.open_file(t, where, write, read))
        if inode.is_dir:
            return pb.OpenResponse(inode=to_pb(inode))
        if request.truncate and inode.length:
            await self._app.truncate(c, at(request.path), 0, "")
            inode, chain = await self._app.tx(c, lambda t: fsops.open_file(t, at(request.path), write, read))
        resp = pb.OpenResponse(inode=to_pb(inode))
        if write:
            resp.session.CopyFrom(session_pb(await self._session(c, inode, chain, request.session_id,
                                                                 request.client_id)))  # fmt: skip
        resp.io_capability.CopyFrom(self._cap(inode, write))
        return resp

    async def Close(self, request: pb.CloseRequest, context: Context) -> pb.CloseResponse:
        mtime = request.mtime_ns if request.HasField("mtime_ns") else None
        inode_id = inode_id_of(request.inode_id)
        written = length_of(request.written_length_bytes, "written_length_bytes")
        try:
            inode = await self._app.close_or_sync(caller(), inode_id, request.session_id, written, mtime,
                                                  close=True)  # fmt: skip
        except FsError as err:
            if err.fs_code is not FsCode.BAD_SESSION:
                raise
            # Closing a closed (or collected) session succeeds; the length is still made exact (from storage
            # only: the caller's hint counts only through a live session).
            inode = await self._app.close_or_sync(caller(), inode_id, "", 0, None, close=False)
        return pb.CloseResponse(inode=to_pb(inode))

    async def Sync(self, request: pb.SyncRequest, context: Context) -> pb.SyncResponse:
        mtime = request.mtime_ns if request.HasField("mtime_ns") else None
        inode_id = inode_id_of(request.inode_id)
        written = length_of(request.written_length_bytes, "written_length_bytes")
        inode = await self._app.close_or_sync(caller(), inode_id, request.session_id, written, mtime,
                                              close=False)  # fmt: skip
        return pb.SyncResponse(inode=to_pb(inode))

    async def RenewSessions(self, request: pb.RenewSessionsRequest, context: Context) -> pb.RenewSessionsResponse:
        if not request.client_id:
            raise fs_error(FsCode.INVALID_ARGUMENT, "client_id is required")
        if len(request.sessions) > MAX_BATCH:
            raise fs_error(FsCode.INVALID_ARGUMENT, f"at most {MAX_BATCH} sessions per RenewSessions")
        reports = [(s.session_id, min(s.inode_id, MAX_INODE_ID), length_of(s.written_length_bytes,
                    "written_length_bytes")) for s in request.sessions]  # fmt: skip
        expires = self._app.lease_expiry()
        lost = await self._app.tx(caller(), lambda t: fsops.renew(t, request.client_id, reports, expires))
        return pb.RenewSessionsResponse(lease_s=self._app.options.lease_s, lost_session_ids=lost)

    async def ReserveSpace(self, request: pb.ReserveSpaceRequest, context: Context) -> pb.ReserveSpaceResponse:
        inode_id = inode_id_of(request.inode_id)
        want = length_of(request.write_limit_bytes, "write_limit_bytes")
        limit, available = await self._app.tx(caller(), lambda t: fsops.reserve(t, inode_id, request.session_id,
                                                                                want, request.partial))  # fmt: skip
        return pb.ReserveSpaceResponse(write_limit_bytes=limit, available_bytes=available)

    async def Rename(self, request: pb.RenameRequest, context: Context) -> pb.RenameResponse:
        inode = await self._app.tx(caller(), lambda t: fsops.rename(t, at(request.src_path), at(request.dst_path),
                                                                    request.no_replace))  # fmt: skip
        return pb.RenameResponse(inode=to_pb(inode))

    async def List(self, request: pb.ListRequest, context: Context) -> pb.ListResponse:
        after = token_after(request.page_token)
        size = page(request.page_size)
        where = at(request.path)
        entries, last = await self._app.read(caller(), lambda t: fsops.list_dir(
            t, where, size, after, request.include_inodes), small=size <= SMALL_PAGE)  # fmt: skip
        out = []
        for name, inode_id, typ, node in entries:
            e = pb.DirEntry(name=name, inode_id=inode_id, type=pb.InodeType.ValueType(int(typ)))
            if node is not None:
                e.inode.CopyFrom(to_pb(node))
            out.append(e)
        return pb.ListResponse(entries=out, next_page_token=token_of(last))

    async def Truncate(self, request: pb.TruncateRequest, context: Context) -> pb.TruncateResponse:
        length = length_of(request.length_bytes, "length_bytes")
        inode = await self._app.truncate(caller(), at(request.path), length, request.session_id)
        return pb.TruncateResponse(inode=to_pb(inode))

    async def SetAttr(self, request: pb.SetAttrRequest, context: Context) -> pb.SetAttrResponse:
        def opt(name: str) -> Any:
            return getattr(request, name) if request.HasField(name) else None  # type: ignore[arg-type]

        if (request.atime_now and request.HasField("atime_ns")) or (request.mtime_now and request.HasField("mtime_ns")):
            raise fs_error(FsCode.INVALID_ARGUMENT, "set either a time or *_now, not both")
        change = AttrChange(mode=opt("mode"), uid=opt("uid"), gid=opt("gid"), atime_ns=opt("atime_ns"),
                            mtime_ns=opt("mtime_ns"), atime_now=request.atime_now, mtime_now=request.mtime_now,
                            layout=layout_of(request.layout, request.HasField("layout")))  # fmt: skip
        where = at(request.path)
        await self._check_table(change.layout)
        inode = await self._app.tx(caller(), lambda t: fsops.set_attr(t, where, request.follow_last_symlink, change))
        return pb.SetAttrResponse(inode=to_pb(inode))

    async def Realpath(self, request: pb.RealpathRequest, context: Context) -> pb.RealpathResponse:
        where = at(request.path)
        path, inode_id = await self._app.tx(caller(), lambda t: fsops.realpath(t, where), read_only=True)
        return pb.RealpathResponse(path=path, inode_id=inode_id)

    async def GetQuota(self, request: pb.GetQuotaRequest, context: Context) -> pb.GetQuotaResponse:
        where = at(request.path)
        rows = await self._app.tx(caller(), lambda t: fsops.get_quota(t, where), read_only=True)
        return pb.GetQuotaResponse(quotas=[quota_pb(q, p) for q, p in rows])

    async def SetQuota(self, request: pb.SetQuotaRequest, context: Context) -> pb.SetQuotaResponse:
        if request.max_bytes >= 1 << 63 or request.max_inodes >= 1 << 63:
            raise fs_error(FsCode.INVALID_ARGUMENT, "quota limit too large")
        q, path = await self._app.tx(caller(), lambda t: fsops.set_quota(t, at(request.path), request.max_bytes,
                                                                         request.max_inodes))  # fmt: skip
        return pb.SetQuotaResponse(quota=quota_pb(q, path))

    async def ListQuotas(self, request: pb.ListQuotasRequest, context: Context) -> pb.ListQuotasResponse:
        rows = await self._app.tx(caller(), fsops.list_quotas, read_only=True, small=False)
        return pb.ListQuotasResponse(quotas=[quota_pb(q, p) for q, p in rows])

    async def ListTrash(self, request: pb.ListTrashRequest, context: Context) -> pb.ListTrashResponse:
        c = caller()
        if request.all_users and not c.is_root:
            raise fs_error(FsCode.NOT_PERMITTED, "only admins list everyone's trash")
        size = page(request.page_size)
        rows, last = await self._app.tx(c, lambda t: trash.list_trash(t, request.all_users, size, request.page_token),
                                        read_only=True, small=size <= SMALL_PAGE)  # fmt: skip
        return pb.ListTrashResponse(entries=[pb.TrashEntry(
            trash_id=r.trash_id, original_path=r.original_path, inode_id=r.inode_id,
            type=pb.InodeType.ValueType(int(r.type)), uid=r.uid, removed_at_ns=r.removed_at_ns,
            expires_at_ns=r.expires_at_ns) for r in rows], next_page_token=last)  # fmt: skip

    async def RestoreTrashEntry(
        self, request: pb.RestoreTrashEntryRequest, context: Context
    ) -> pb.RestoreTrashEntryResponse:
        to = at(request.path) if request.HasField("path") and request.path.path else None
        inode, path = await self._app.tx(caller(), lambda t: trash.restore_trash(t, request.trash_id, to))
        return pb.RestoreTrashEntryResponse(inode=to_pb(inode), path=path)

    async def EmptyTrash(self, request: pb.EmptyTrashRequest, context: Context) -> pb.EmptyTrashResponse:
        if len(request.trash_ids) > MAX_TRASH_IDS:
            raise fs_error(FsCode.INVALID_ARGUMENT, f"at most {MAX_TRASH_IDS} trash ids per EmptyTrash")
        n = await self._app.empty_trash(caller(), list(dict.fromkeys(request.trash_ids)), request.expired_only)
        return pb.EmptyTrashResponse(num_deleted=n)


def check_batch(n: int, what: str) -> None:
    if n > MAX_WRITE_BATCH:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"at most {MAX_WRITE_BATCH} items per {what} ({n} given)")


def _reserved(t: Tx, sess: SessionInfo, reserve: int) -> SessionInfo:
    """The session with its quota reserved up to ``reserve`` (ReserveSpace in the same transaction)."""
    if reserve <= sess.write_limit:
        return sess
    limit, _ = fsops.reserve(t, sess.inode_id, sess.session_id, reserve)
    return dataclasses.replace(sess, write_limit=limit)


async def _ids(app: MetaApp, n: int) -> list[int]:
    ready = app.ids.take_now(n)
    if ready is not None:
        return ready
    return await asyncio.to_thread(app.ids.take, n)


def _parts(path: str) -> tuple[bool, list[str]]:
    return split_path(path)
