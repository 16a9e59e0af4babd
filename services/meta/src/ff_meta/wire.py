"""Meta's protocol messages to and from the operators' domain types.

At the servicer: requests checked and converted (bounds first: bad input is INVALID_ARGUMENT, or ENOENT for an inode id
no store can hold, before any work), answers built. Nothing below the servicer sees a protobuf message of meta's.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.model import (
    AttrChange,
    Inode,
    InodeType,
    LayoutSpec,
    PathAt,
    QuotaRow,
    SessionInfo,
    TrashRow,
)
from ff_meta.core.perms import Caller
from ff_meta.ops.types import Capability, CloseArgs, CreateArgs, DirPage, FsSpace, OpenArgs, Opened, StatItem
from ff_rpc import Principal, current_principal
from ff_rpc.once import once_value
from fireflyer.meta.v1 import meta_pb2 as pb

T = TypeVar("T")
M = TypeVar("M")
DEFAULT_PAGE = 1000
MAX_PAGE = 10000
MAX_BATCH = 10000  # paths of a BatchStat, reports of a RenewSessions
MAX_WRITE_BATCH = 1024  # items of a BatchCreate or BatchClose (each a write transaction)
# Inode ids are positive and below 2^63 (the store's integers are signed 64-bit); lengths below 2^62.
MAX_INODE_ID = (1 << 63) - 1
MAX_LENGTH = 1 << 62
MAX_TRASH_IDS = 1000
READ, WRITE, RW = pb.OPEN_MODE_READ, pb.OPEN_MODE_WRITE, pb.OPEN_MODE_READ_WRITE


# The Caller of recent principals, by the principal's identity: the token validator's cache hands the same frozen
# Principal to every call with a token, and a Caller costs ~1.4 us to make, the look-up ~0.2 (the principal is held,
# so its id is not reused while its entry is kept).
_CALLERS_MAX = 1024
_callers: dict[int, tuple[Principal, Caller]] = {}


def caller() -> Caller:
    """The caller of the current RPC (its token's user; admins and the cluster token are root)."""
    p = current_principal()
    known = _callers.get(id(p))
    if known is not None and known[0] is p:
        return known[1]
    made = Caller(uid=p.uid, gids=tuple(p.gids), name=p.name, is_root=p.is_admin)
    if len(_callers) >= _CALLERS_MAX:
        _callers.clear()
    _callers[id(p)] = (p, made)
    return made


def once_key(metadata: Iterable[tuple[str, str | bytes]], method: str) -> str | None:
    """The key of a call done once (``store/once.py``): method, caller's uid, client's key; None without a key.

    Raises:
        InvalidArgument: a malformed key (``ff_rpc.once.once_value``).
    """
    value = once_value(tuple(metadata))
    return None if value is None else f"{method}/{caller().uid}/{value}"


# ---- bounds ----


def inode_id_of(value: int) -> int:
    """An inode id from a request: one the store cannot hold names no inode (ENOENT), checked before any work."""
    if value > MAX_INODE_ID:
        raise fs_error(FsCode.NOT_FOUND, f"no inode {value} (inode ids are below 2^63)")
    return value


def length_of(value: int, what: str) -> int:
    """A length or write limit from a request (below 2^62)."""
    if value >= MAX_LENGTH:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"{what} {value} is too large (at most 2^62 - 1)")
    return value


def check_batch(n: int, what: str, limit: int = MAX_WRITE_BATCH) -> None:
    """EINVAL for a batch of more than ``limit`` items."""
    if n > limit:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"at most {limit} items per {what} ({n} given)")


def each(items: Iterable[M], convert: Callable[[M], T]) -> list[T | FsError]:
    """``convert`` of each item, or the FsError it raised in its place (one bad item fails only itself)."""
    out: list[T | FsError] = []
    for item in items:
        try:
            out.append(convert(item))
        except FsError as err:
            out.append(err)
    return out


# ---- requests ----


def path_at(msg: pb.PathAt) -> PathAt:
    """A ``PathAt`` (its inode id checked)."""
    return PathAt(inode_id_of(msg.parent_inode_id), msg.path)


def layout_of(msg: pb.Layout, present: bool) -> LayoutSpec | None:
    """A layout if the request has one."""
    if not present:
        return None
    return LayoutSpec(msg.chain_table_id, msg.chunk_size_bytes, msg.stripe_size)


def open_mode_of(value: int, default: int) -> int:
    """An open mode the proto knows (EINVAL otherwise); ``default`` when unspecified."""
    if value not in (pb.OPEN_MODE_UNSPECIFIED, READ, WRITE, RW):
        raise fs_error(FsCode.INVALID_ARGUMENT, f"unknown open_mode {value}")
    return value or default


def _check_write_open(write: bool, truncate: bool, session_id: str, client_id: str) -> None:
    if truncate and not write:
        raise fs_error(FsCode.INVALID_ARGUMENT, "O_TRUNC needs a write mode")
    if write and (not session_id or not client_id):
        raise fs_error(FsCode.INVALID_ARGUMENT, "a write open needs a session_id and a client_id")


def create_args(r: pb.CreateRequest) -> CreateArgs:
    """A Create checked: modes, reservation, session, ids."""
    write = open_mode_of(r.open_mode, READ) in (WRITE, RW)
    reserve = length_of(r.reserve_bytes, "reserve_bytes")
    if reserve and not write:
        raise fs_error(FsCode.INVALID_ARGUMENT, "reserve_bytes needs a write mode")
    _check_write_open(write, r.truncate, r.session_id, r.client_id)
    return CreateArgs(
        path=path_at(r.path),
        mode=r.mode,
        exclusive=r.exclusive,
        write=write,
        truncate=r.truncate,
        layout=layout_of(r.layout, r.HasField("layout")),
        reserve_bytes=reserve,
        session_id=r.session_id,
        client_id=r.client_id,
        set_mode=r.set_mode if r.HasField("set_mode") else None,
        expect_inode_id=inode_id_of(r.expect_inode_id),
    )


def batch_create_args(r: pb.BatchCreateRequest) -> list[CreateArgs | FsError]:
    """Each item of a BatchCreate, or its error (at most ``MAX_WRITE_BATCH``)."""
    check_batch(len(r.creates), "BatchCreate")
    return each(r.creates, create_args)


def open_args(r: pb.OpenRequest) -> OpenArgs:
    """An Open checked: mode, O_TRUNC only with write, session."""
    mode = open_mode_of(r.open_mode, READ)
    write, read = mode in (WRITE, RW), mode in (READ, RW)
    _check_write_open(write, r.truncate, r.session_id, r.client_id)
    return OpenArgs(
        path=path_at(r.path),
        read=read,
        write=write,
        truncate=r.truncate,
        session_id=r.session_id,
        client_id=r.client_id,
    )


def close_args(r: pb.CloseRequest | pb.SyncRequest) -> CloseArgs:
    """A Close or Sync checked: inode id, written length."""
    return CloseArgs(
        inode_id_of(r.inode_id),
        r.session_id,
        length_of(r.written_length_bytes, "written_length_bytes"),
        r.mtime_ns if r.HasField("mtime_ns") else None,
    )


def batch_close_args(r: pb.BatchCloseRequest) -> list[CloseArgs | FsError]:
    """Each item of a BatchClose, or its error (at most ``MAX_WRITE_BATCH``)."""
    check_batch(len(r.closes), "BatchClose")
    return each(r.closes, close_args)


def batch_stat_paths(r: pb.BatchStatRequest) -> list[PathAt | FsError]:
    """Each path of a BatchStat, or its error (at most ``MAX_BATCH``)."""
    check_batch(len(r.paths), "BatchStat", MAX_BATCH)
    return each(r.paths, path_at)


def renew_reports(r: pb.RenewSessionsRequest) -> list[tuple[str, int, int]]:
    """(session id, inode id, written) of each report; an id past the store's is one no session has."""
    if not r.client_id:
        raise fs_error(FsCode.INVALID_ARGUMENT, "client_id is required")
    check_batch(len(r.sessions), "RenewSessions", MAX_BATCH)
    return [
        (s.session_id, min(s.inode_id, MAX_INODE_ID), length_of(s.written_length_bytes, "written_length_bytes"))
        for s in r.sessions
    ]


def page_size(size: int) -> int:
    """The page size asked for (the default when 0), at most ``MAX_PAGE``."""
    return min(size or DEFAULT_PAGE, MAX_PAGE)


def name_after(token: str) -> str:
    """The name a page token says to list after ("": from the start)."""
    if not token:
        return ""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise fs_error(FsCode.INVALID_ARGUMENT, "bad page_token") from None


def page_token(name: str) -> str:
    """The token of the page after ``name`` ("": no more pages)."""
    return base64.urlsafe_b64encode(name.encode()).decode() if name else ""


def inode_type(value: int) -> InodeType:
    """An inode type the proto knows (EINVAL otherwise)."""
    try:
        return InodeType(value)
    except ValueError:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"unknown inode type {value}") from None


def attr_change(r: pb.SetAttrRequest) -> AttrChange:
    """A SetAttr's changes (a time and its *_now together are EINVAL)."""
    if (r.atime_now and r.HasField("atime_ns")) or (r.mtime_now and r.HasField("mtime_ns")):
        raise fs_error(FsCode.INVALID_ARGUMENT, "set either a time or *_now, not both")
    has = r.HasField
    return AttrChange(
        mode=r.mode if has("mode") else None,
        uid=r.uid if has("uid") else None,
        gid=r.gid if has("gid") else None,
        atime_ns=r.atime_ns if has("atime_ns") else None,
        mtime_ns=r.mtime_ns if has("mtime_ns") else None,
        atime_now=r.atime_now,
        mtime_now=r.mtime_now,
        layout=layout_of(r.layout, has("layout")),
    )


def quota_limits(r: pb.SetQuotaRequest) -> tuple[int, int]:
    """A SetQuota's limits (below 2^63)."""
    if r.max_bytes >= 1 << 63 or r.max_inodes >= 1 << 63:
        raise fs_error(FsCode.INVALID_ARGUMENT, "quota limit too large")
    return r.max_bytes, r.max_inodes


def trash_ids(r: pb.EmptyTrashRequest) -> list[str]:
    """An EmptyTrash's ids, each once (at most ``MAX_TRASH_IDS``)."""
    if len(r.trash_ids) > MAX_TRASH_IDS:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"at most {MAX_TRASH_IDS} trash ids per EmptyTrash")
    return list(dict.fromkeys(r.trash_ids))


def restore_to(r: pb.RestoreTrashEntryRequest) -> PathAt | None:
    """Where a RestoreTrashEntry puts the entry back (None: where it was)."""
    return path_at(r.path) if r.HasField("path") and r.path.path else None


# ---- answers ----


def inode_pb(inode: Inode, sessions: int = 0) -> pb.Inode:
    # A directory's stored count is 1 plus its subdirectories; it shows 2 plus them (its "." too); at least 2
    # for the folders made before the count was kept.
    """The proto's Inode."""
    kind = inode.type
    is_dir = kind is InodeType.DIRECTORY
    layout = (
        pb.Layout(
            chain_table_id=inode.chain_table_id,
            chain_table_version=inode.chain_table_version,
            chunk_size_bytes=inode.chunk_size,
            stripe_size=inode.stripe_size,
            chain_begin_index=inode.chain_begin,
            shuffle_seed=inode.shuffle_seed,
        )
        if is_dir or kind is InodeType.FILE
        else None
    )
    return pb.Inode(
        inode_id=inode.inode_id,
        type=pb.InodeType.ValueType(kind),
        mode=inode.mode,
        uid=inode.uid,
        gid=inode.gid,
        nlink=max(2, inode.nlink + 1) if is_dir else inode.nlink,
        atime_ns=inode.atime_ns,
        mtime_ns=inode.mtime_ns,
        ctime_ns=inode.ctime_ns,
        length_bytes=inode.length,
        parent_inode_id=inode.parent_id if is_dir else 0,
        symlink_target=inode.symlink_target if kind is InodeType.SYMLINK else "",
        num_write_sessions=sessions,
        rdev=inode.rdev,
        layout=layout,
    )


def error_code(err: FsError) -> pb.FsError.ValueType:
    """The proto's FsError value of an error."""
    return pb.FsError.ValueType(int(err.fs_code))


def capability_pb(cap: Capability) -> pb.IoCapability:
    """The proto's IoCapability."""
    return pb.IoCapability(
        token=cap.token, inode_id=cap.inode_id, writable=cap.writable, expires_at_ns=cap.expires_at_ns
    )


def session_pb(s: SessionInfo) -> pb.WriteSession:
    """The proto's WriteSession."""
    return pb.WriteSession(
        session_id=s.session_id,
        client_id=s.client_id,
        inode_id=s.inode_id,
        write_limit_bytes=s.write_limit,
        lease_s=s.lease_s,
    )


def quota_pb(q: QuotaRow, path: str) -> pb.DirQuota:
    """The proto's DirQuota (used bytes include the reserved ones)."""
    return pb.DirQuota(
        inode_id=q.inode_id,
        path=path,
        max_bytes=q.max_bytes,
        max_inodes=q.max_inodes,
        used_bytes=q.used_bytes + q.reserved_bytes,
        used_inodes=q.used_inodes,
        reserved_bytes=q.reserved_bytes,
    )


def statfs_response(s: FsSpace) -> pb.StatFsResponse:
    """StatFs's answer."""
    return pb.StatFsResponse(
        capacity_bytes=s.capacity_bytes, used_bytes=s.used_bytes, free_bytes=s.free_bytes, num_inodes=s.num_inodes
    )


def batch_stat_response(results: list[StatItem | FsError]) -> pb.BatchStatResponse:
    """BatchStat's answer, an error code per failed path."""
    out = []
    for r in results:
        if isinstance(r, FsError):
            out.append(pb.StatResult(error=error_code(r)))
            continue
        item = pb.StatResult(inode=inode_pb(r.inode))
        if r.read_capability is not None:
            item.read_capability.CopyFrom(capability_pb(r.read_capability))
        out.append(item)
    return pb.BatchStatResponse(results=out)


def create_response(o: Opened) -> pb.CreateResponse:
    """Create's answer."""
    resp = pb.CreateResponse(inode=inode_pb(o.inode), created=o.created)
    if o.session is not None:
        resp.session.CopyFrom(session_pb(o.session))
    if o.capability is not None:
        resp.io_capability.CopyFrom(capability_pb(o.capability))
    if o.quota_room is not None:
        resp.quota_room_bytes, resp.quota_inode_id = o.quota_room
    return resp


def batch_create_response(results: list[Opened | FsError]) -> pb.BatchCreateResponse:
    """BatchCreate's answer, an error and message per failed item."""
    return pb.BatchCreateResponse(
        results=[
            pb.CreateResult(error=error_code(r), message=str(r))
            if isinstance(r, FsError)
            else pb.CreateResult(response=create_response(r))
            for r in results
        ]
    )


def open_response(o: Opened) -> pb.OpenResponse:
    """Open's answer."""
    resp = pb.OpenResponse(inode=inode_pb(o.inode))
    if o.session is not None:
        resp.session.CopyFrom(session_pb(o.session))
    if o.capability is not None:
        resp.io_capability.CopyFrom(capability_pb(o.capability))
    return resp


def batch_close_response(results: list[Inode | FsError]) -> pb.BatchCloseResponse:
    """BatchClose's answer, an error and message per failed item."""
    return pb.BatchCloseResponse(
        results=[
            pb.CloseResult(error=error_code(r), message=str(r))
            if isinstance(r, FsError)
            else pb.CloseResult(inode=inode_pb(r))
            for r in results
        ]
    )


def list_response(page: DirPage) -> pb.ListResponse:
    """List's answer."""
    resp = pb.ListResponse(next_page_token=page_token(page.last_name))
    add = resp.entries.add  # built in place: a list of DirEntry messages handed to ListResponse is copied (3x slower)
    for name, inode_id, typ, node in page.entries:
        inode = None if node is None else inode_pb(node)
        add(name=name, inode_id=inode_id, type=pb.InodeType.ValueType(typ), inode=inode)
    return resp


class KeptMessages(Generic[M]):
    """Messages built from answers that meta's read cache hands out again, by the identity of the answer.

    An answer the read cache (or the listing cache) served is the same object each time, so its message is built once.
    ``size`` counts what a message holds (a listing page: its names); past ``max_size`` in all the oldest go first.
    The answers are held, so their ids are not reused while their messages are kept. The messages go to grpc or the
    fast path, which only serialize them.
    """

    def __init__(self, max_size: int) -> None:
        self._max_size = max_size
        self._size = 0
        self._known: dict[int, tuple[object, Hashable, M, int]] = {}

    def get(self, answer: object, tag: Hashable) -> M | None:
        """The message put for this very ``answer`` object with an equal ``tag``; None otherwise."""
        known = self._known.get(id(answer))
        if known is not None and known[0] is answer and known[1] == tag:
            return known[2]
        return None

    def put(self, answer: object, tag: Hashable, message: M, size: int = 1) -> None:
        """Keep ``message`` for ``answer`` (not when it alone is over the bound)."""
        if size > self._max_size:
            return
        old = self._known.pop(id(answer), None)
        if old is not None:
            self._size -= old[3]
        self._known[id(answer)] = (answer, tag, message, size)
        self._size += size
        while self._size > self._max_size:
            dropped = self._known.pop(next(iter(self._known)))
            self._size -= dropped[3]


class ListResponses:
    """The ListResponse of recent names-only pages, by the identity of the page's entries.

    A page that meta's listing cache answered is the same list object each time (``store.listing``), so its message
    is built once (100 names cost ~100 us to build, ~4 us to serialize). Up to ``max_entries`` entries in all.
    """

    def __init__(self, max_entries: int = 20_000) -> None:
        self._built: KeptMessages[pb.ListResponse] = KeptMessages(max_entries)

    def response(self, page: DirPage) -> pb.ListResponse:
        """List's answer for ``page`` (built once per entries list)."""
        known = self._built.get(page.entries, page.last_name)
        if known is None:
            known = list_response(page)
            self._built.put(page.entries, page.last_name, known, len(page.entries))
        return known


class StatResponses:
    """The StatResponse of recent stats, by the identity of the answer's inode.

    A Stat that meta's read cache answered gives the same Inode object each time (``ops.namespace``), so its message
    is built once (~4 us in a hot loop, more between other calls). Up to ``max_entries`` inodes.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self._built: KeptMessages[pb.StatResponse] = KeptMessages(max_entries)

    def response(self, inode: Inode, sessions: int) -> pb.StatResponse:
        """Stat's answer for ``inode`` with ``sessions`` open write sessions."""
        known = self._built.get(inode, sessions)
        if known is None:
            known = pb.StatResponse(inode=inode_pb(inode, sessions))
            self._built.put(inode, sessions, known)
        return known


def trash_response(page: tuple[list[TrashRow], str]) -> pb.ListTrashResponse:
    """ListTrash's answer."""
    rows, last = page
    return pb.ListTrashResponse(
        entries=[
            pb.TrashEntry(
                trash_id=r.trash_id,
                original_path=r.original_path,
                inode_id=r.inode_id,
                type=pb.InodeType.ValueType(int(r.type)),
                uid=r.uid,
                removed_at_ns=r.removed_at_ns,
                expires_at_ns=r.expires_at_ns,
            )
            for r in rows
        ],
        next_page_token=last,
    )
