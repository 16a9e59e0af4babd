"""The check of a reported checkpoint: its manifest must be a file in 3FS that the task's user owns.

An agent relays what a task's ``hfai.client.report_checkpoint(path, step)`` said; a checkpoint counts
(and can end a suspend before its grace) only once it is durable, so the scheduler asks meta about the
manifest before storing it. The Stat runs as the task's user (``ff-act-as``, which the cluster token may
send): a path that user cannot reach is refused, and so is a file someone else owns, so a user cannot claim
another user's checkpoint as their own.
"""

from __future__ import annotations

import errno
import stat

from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from ff_rpc.acting import Identity, acting_as
from ff_scheduler.core.errors import Conflict, Forbidden, InvalidRequest, Unavailable
from fireflyer.meta.v1 import meta_pb2
from hf3fs.meta_client import Hf3fsError, MetaClient, os_error
from hf3fs.uri import strip_scheme


class ManifestCheck:
    """Stats reported manifests in 3FS as the task's user."""

    def __init__(self, mgmtd: MgmtdClient, cluster_token: str, timeout_s: float = 5.0) -> None:
        self._meta = MetaClient(mgmtd, cluster_token, timeout_s=timeout_s, attempts=3)

    async def close(self) -> None:
        """Close the client of meta."""
        await self._meta.close()

    async def check(self, path: str, uid: int) -> None:
        """Return when ``path`` is a file in 3FS owned by ``uid``, reachable and readable by that user.

        Raises:
            InvalidRequest: ``path`` is not an absolute 3FS path, or not a valid one (a NUL byte, a name too long).
            Conflict: no such file (the checkpoint is not durable there), not a file (a folder, a symlink loop), a
                file still open for writing, or an empty one.
            Forbidden: the user may not reach it or read it, or another user owns it.
            Unavailable: meta did not answer.
        """
        if "\0" in path:
            raise InvalidRequest(f"checkpoint.path {path[:200]!r} contains a NUL byte")
        try:
            fs_path = strip_scheme(path)
        except ValueError:
            raise InvalidRequest(f"checkpoint.path {path[:200]!r} is not an absolute 3FS path") from None
        _check_inode(fs_path, await self._stat(fs_path, uid), uid)

    async def _stat(self, fs_path: str, uid: int) -> meta_pb2.Inode:
        """The inode at ``fs_path`` (symlinks followed), asked as user ``uid``; meta's errors as ``check`` raises."""
        request = meta_pb2.StatRequest(path=meta_pb2.PathAt(path=fs_path), follow_last_symlink=True)
        try:
            with acting_as(Identity(uid, ())):
                resp = await self._meta.call(lambda m: m.stat, request)
        except RpcError as err:
            e = os_error(err, fs_path)
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                raise Conflict(f"checkpoint {fs_path}: no such file in 3FS; not counted") from None
            if e.errno == errno.ELOOP:
                raise Conflict(f"checkpoint {fs_path}: a loop of symlinks, not a file; not counted") from None
            if e.errno in (errno.EACCES, errno.EPERM):
                raise Forbidden(f"checkpoint {fs_path}: the task's user (uid {uid}) may not reach it") from None
            if e.errno in (errno.EINVAL, errno.ENAMETOOLONG):  # the path's fault: asking again will not help
                raise InvalidRequest(f"checkpoint {fs_path[:200]!r}: {err.details}") from None
            raise Unavailable(f"checkpoint {fs_path}: meta answered {err.code.name}: {err.details}") from None
        except Hf3fsError as err:
            raise Unavailable(f"checkpoint {fs_path}: cannot ask 3FS ({err})") from None
        inode: meta_pb2.Inode = resp.inode
        return inode


def _check_inode(fs_path: str, inode: meta_pb2.Inode, uid: int) -> None:
    """A durable checkpoint file of user ``uid``: ``ManifestCheck.check``'s checks of the inode itself."""
    if inode.type != meta_pb2.INODE_TYPE_FILE:
        raise Conflict(f"checkpoint {fs_path}: not a file in 3FS; not counted")
    if inode.uid != uid:
        raise Forbidden(f"checkpoint {fs_path}: owned by uid {inode.uid}, not by the task's user (uid {uid})")
    if uid != 0 and not inode.mode & stat.S_IRUSR:  # the next run could not read it back
        raise Forbidden(f"checkpoint {fs_path}: mode {inode.mode:04o}, the task's user (uid {uid}) may not read it")
    if inode.num_write_sessions:  # its length and bytes are settled only at its close
        raise Conflict(f"checkpoint {fs_path}: still open for writing, not durable yet; not counted")
    if not inode.length_bytes:
        raise Conflict(f"checkpoint {fs_path}: an empty file, not a checkpoint; not counted")
