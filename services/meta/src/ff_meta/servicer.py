"""Thin gRPC adapters, one line per RPC.

The request to domain arguments (``wire``), the operator (``ops``), the answer back to protobuf (``wire``). Errors map
to status codes in ``ff_meta.errors``.
"""

from __future__ import annotations

from typing import Any

import grpc

from ff_meta import wire
from ff_meta.ops import MetaOps
from ff_meta.wire import caller, path_at
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.meta.v1 import meta_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


class MetaServicer(meta_pb2_grpc.MetaServiceServicer):
    """The MetaService RPCs (the proto documents each)."""

    def __init__(self, ops: MetaOps) -> None:
        self._ns, self._files, self._quotas, self._trash = ops.namespace, ops.files, ops.quotas, ops.trash
        self._listings = wire.ListResponses()
        self._stats = wire.StatResponses()

    async def StatFs(self, request: pb.StatFsRequest, context: Context) -> pb.StatFsResponse:
        return wire.statfs_response(await self._ns.statfs(caller()))

    async def Stat(self, request: pb.StatRequest, context: Context) -> pb.StatResponse:
        inode, sessions = await self._ns.stat(caller(), path_at(request.path), request.follow_last_symlink)
        return self._stats.response(inode, sessions)

    async def BatchStat(self, request: pb.BatchStatRequest, context: Context) -> pb.BatchStatResponse:
        return wire.batch_stat_response(
            await self._ns.batch_stat(
                caller(), wire.batch_stat_paths(request), request.follow_last_symlink, request.include_read_capability
            )
        )

    async def Create(self, request: pb.CreateRequest, context: Context) -> pb.CreateResponse:
        return wire.create_response(await self._files.create(caller(), wire.create_args(request)))

    async def BatchCreate(self, request: pb.BatchCreateRequest, context: Context) -> pb.BatchCreateResponse:
        return wire.batch_create_response(await self._files.batch_create(caller(), wire.batch_create_args(request)))

    async def Open(self, request: pb.OpenRequest, context: Context) -> pb.OpenResponse:
        return wire.open_response(await self._files.open(caller(), wire.open_args(request)))

    async def Close(self, request: pb.CloseRequest, context: Context) -> pb.CloseResponse:
        return pb.CloseResponse(inode=wire.inode_pb(await self._files.close(caller(), wire.close_args(request))))

    async def Sync(self, request: pb.SyncRequest, context: Context) -> pb.SyncResponse:
        return pb.SyncResponse(inode=wire.inode_pb(await self._files.sync(caller(), wire.close_args(request))))

    async def BatchClose(self, request: pb.BatchCloseRequest, context: Context) -> pb.BatchCloseResponse:
        return wire.batch_close_response(await self._files.batch_close(caller(), wire.batch_close_args(request)))

    async def Truncate(self, request: pb.TruncateRequest, context: Context) -> pb.TruncateResponse:
        length = wire.length_of(request.length_bytes, "length_bytes")
        inode = await self._files.truncate(caller(), path_at(request.path), length, request.session_id)
        return pb.TruncateResponse(inode=wire.inode_pb(inode))

    async def RenewSessions(self, request: pb.RenewSessionsRequest, context: Context) -> pb.RenewSessionsResponse:
        lease_s, lost = await self._files.renew_sessions(caller(), request.client_id, wire.renew_reports(request))
        return pb.RenewSessionsResponse(lease_s=lease_s, lost_session_ids=lost)

    async def ReserveSpace(self, request: pb.ReserveSpaceRequest, context: Context) -> pb.ReserveSpaceResponse:
        limit, available, cap = await self._files.reserve_space(
            caller(),
            wire.inode_id_of(request.inode_id),
            request.session_id,
            wire.length_of(request.write_limit_bytes, "write_limit_bytes"),
            request.partial,
        )
        return pb.ReserveSpaceResponse(
            write_limit_bytes=limit, available_bytes=available, io_capability=wire.capability_pb(cap)
        )

    async def Mkdirs(self, request: pb.MkdirsRequest, context: Context) -> pb.MkdirsResponse:
        return pb.MkdirsResponse(
            inode=wire.inode_pb(
                await self._ns.mkdirs(
                    caller(),
                    path_at(request.path),
                    request.mode or 0o755,
                    request.recursive,
                    wire.layout_of(request.layout, request.HasField("layout")),
                    _once(context, "Mkdirs"),
                )
            )
        )

    async def Symlink(self, request: pb.SymlinkRequest, context: Context) -> pb.SymlinkResponse:
        return pb.SymlinkResponse(
            inode=wire.inode_pb(
                await self._ns.symlink(caller(), path_at(request.path), request.target, _once(context, "Symlink"))
            )
        )

    async def Mknod(self, request: pb.MknodRequest, context: Context) -> pb.MknodResponse:
        kind = wire.inode_type(request.type)
        once = _once(context, "Mknod")
        inode = await self._ns.mknod(caller(), path_at(request.path), kind, request.mode, request.rdev, once)
        return pb.MknodResponse(inode=wire.inode_pb(inode))

    async def HardLink(self, request: pb.HardLinkRequest, context: Context) -> pb.HardLinkResponse:
        once = _once(context, "HardLink")
        inode = await self._ns.hardlink(caller(), path_at(request.old_path), path_at(request.new_path), once)
        return pb.HardLinkResponse(inode=wire.inode_pb(inode))

    async def Remove(self, request: pb.RemoveRequest, context: Context) -> pb.RemoveResponse:
        expect_dir = request.expect_directory if request.HasField("expect_directory") else None
        return pb.RemoveResponse(
            trash_id=await self._ns.remove(
                caller(),
                path_at(request.path),
                request.recursive,
                request.to_trash,
                request.trash_retention_s,
                expect_dir,
                _once(context, "Remove"),
            )
        )

    async def Rename(self, request: pb.RenameRequest, context: Context) -> pb.RenameResponse:
        inode = await self._ns.rename(
            caller(), path_at(request.src_path), path_at(request.dst_path), request.no_replace, _once(context, "Rename")
        )
        return pb.RenameResponse(inode=wire.inode_pb(inode))

    async def List(self, request: pb.ListRequest, context: Context) -> pb.ListResponse:
        after, with_inodes = wire.name_after(request.page_token), request.include_inodes
        page = await self._ns.list_dir(
            caller(), path_at(request.path), wire.page_size(request.page_size), after, with_inodes
        )
        return wire.list_response(page) if with_inodes else self._listings.response(page)

    async def SetAttr(self, request: pb.SetAttrRequest, context: Context) -> pb.SetAttrResponse:
        change = wire.attr_change(request)
        inode = await self._ns.set_attr(caller(), path_at(request.path), request.follow_last_symlink, change)
        return pb.SetAttrResponse(inode=wire.inode_pb(inode))

    async def Realpath(self, request: pb.RealpathRequest, context: Context) -> pb.RealpathResponse:
        path, inode_id = await self._ns.realpath(caller(), path_at(request.path))
        return pb.RealpathResponse(path=path, inode_id=inode_id)

    async def GetQuota(self, request: pb.GetQuotaRequest, context: Context) -> pb.GetQuotaResponse:
        rows = await self._quotas.get(caller(), path_at(request.path))
        return pb.GetQuotaResponse(quotas=[wire.quota_pb(q, p) for q, p in rows])

    async def SetQuota(self, request: pb.SetQuotaRequest, context: Context) -> pb.SetQuotaResponse:
        limits = wire.quota_limits(request)
        return pb.SetQuotaResponse(
            quota=wire.quota_pb(*await self._quotas.set(caller(), path_at(request.path), *limits))
        )

    async def ListQuotas(self, request: pb.ListQuotasRequest, context: Context) -> pb.ListQuotasResponse:
        return pb.ListQuotasResponse(quotas=[wire.quota_pb(q, p) for q, p in await self._quotas.list(caller())])

    async def ListTrash(self, request: pb.ListTrashRequest, context: Context) -> pb.ListTrashResponse:
        return wire.trash_response(
            await self._trash.list(caller(), request.all_users, wire.page_size(request.page_size), request.page_token)
        )

    async def RestoreTrashEntry(
        self, request: pb.RestoreTrashEntryRequest, context: Context
    ) -> pb.RestoreTrashEntryResponse:
        once = _once(context, "RestoreTrashEntry")
        inode, path = await self._trash.restore(caller(), request.trash_id, wire.restore_to(request), once)
        return pb.RestoreTrashEntryResponse(inode=wire.inode_pb(inode), path=path)

    async def EmptyTrash(self, request: pb.EmptyTrashRequest, context: Context) -> pb.EmptyTrashResponse:
        n = await self._trash.empty(caller(), wire.trash_ids(request), request.expired_only)
        return pb.EmptyTrashResponse(num_deleted=n)


def _once(context: Context, method: str) -> str | None:
    """The call's key when the client sent one (``ff_fsprotocol.meta_once`` lists the methods that take it)."""
    return wire.once_key(context.invocation_metadata() or (), method)
