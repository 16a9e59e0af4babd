"""How a FUSE callback of the mount runs: its failure as an errno, and as which user (``--multi-user``)."""

from __future__ import annotations

import errno
import functools
import logging
import stat
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

import mfusepy

from ff_rpc import Identity, acting_as
from hf3fs.fuse.options import MountOptions

logger = logging.getLogger("hf3fs.fuse.ops")  # the callbacks' failures, logged as the callbacks' own
_F = TypeVar("_F", bound=Callable[..., Any])


class MountCallbacks(Protocol):
    """The callbacks' object as ``as_caller`` sees it: it knows its options."""

    options: MountOptions


def errno_of(err: BaseException) -> int:
    """The errno a failure leaves the mount with: an OSError's own, EINVAL for a ValueError, else EIO."""
    if isinstance(err, OSError) and isinstance(err.errno, int) and err.errno > 0:
        return err.errno
    if isinstance(err, ValueError):
        return errno.EINVAL
    return errno.EIO


def fuse_errors(method: _F) -> _F:
    """Every failure leaves as the errno the client gave (EIO when the cluster could not be reached)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except mfusepy.FuseOSError:
            raise
        except (OSError, ValueError) as err:  # hf3fs.Hf3fsError is a ConnectionError: EIO
            code = errno_of(err)
            if code == errno.EIO:
                logger.warning("%s%s failed: %s", method.__name__, args[1:2], err)
            raise mfusepy.FuseOSError(code) from err

    return cast(_F, wrapper)


def _groups_of(pid: int) -> tuple[int, ...]:
    """The supplementary groups of a (thread of a) process, from /proc; () when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return tuple(int(g) for g in line.split()[1:] if g.isdigit())
    except OSError:
        pass
    return ()


def caller_identity() -> Identity:
    """Who made the FUSE request being served: its uid, its gid first, then its supplementary groups."""
    uid, gid, pid = mfusepy.fuse_get_context()
    return Identity(uid, (gid, *(g for g in _groups_of(pid) if g != gid)))


def as_caller(method: _F) -> _F:
    """A request on names (not on an open handle): in a multi-user mount it runs in meta as its caller.

    So meta's permission checks apply to them (an open handle's reads, writes and close were checked at open).
    """

    @functools.wraps(method)
    def wrapper(self: MountCallbacks, *args: Any, **kwargs: Any) -> Any:
        if not self.options.multi_user:
            return method(self, *args, **kwargs)
        with acting_as(caller_identity()):
            return method(self, *args, **kwargs)

    return cast(_F, fuse_errors(wrapper))


def drops_set_id_bits_only(fs: Any, path: str, mode: int) -> bool:
    """Whether a chmod of ``path`` to ``mode`` only clears the set-uid/set-gid bits of a file the caller does not own.

    With default_permissions the kernel refuses a non-owner's chmod itself, so this is the kernel's own
    (file_remove_privs, on a write through a handle opened for writing). The file's mode is read as the mount's user.
    """
    uid = caller_identity().uid
    with acting_as(None):
        st = fs.lstat(path)
    kept = st.mode & ~(stat.S_ISUID | stat.S_ISGID)
    return bool(uid not in (0, st.uid) and (mode & 0o7777) == kept and st.mode != kept)
