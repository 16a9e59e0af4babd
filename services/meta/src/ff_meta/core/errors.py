"""File-system errors of meta: one POSIX error each (FsCode mirrors the proto's FsError values).

Every error carries the trailing metadata ``ff-fs-error`` with the FsError name, which the RPC layer
sends with the status, so clients map it to an errno.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

FS_ERROR_METADATA = "ff-fs-error"


class FsCode(IntEnum):
    """A file-system error, as the proto's FsError values."""

    NOT_FOUND = 1
    EXISTS = 2
    NOT_DIRECTORY = 3
    IS_DIRECTORY = 4
    NOT_EMPTY = 5
    ACCESS_DENIED = 6
    NOT_PERMITTED = 7
    NAME_TOO_LONG = 8
    INVALID_ARGUMENT = 9
    SYMLINK_LOOP = 10
    RENAME_LOOP = 11
    QUOTA_EXCEEDED = 12
    NO_SPACE = 13
    TOO_MANY_LINKS = 14
    BAD_SESSION = 15
    BUSY = 16
    CONFLICT = 17
    STALE = 18

    @property
    def wire_name(self) -> str:
        """The proto enum's name (``ff-fs-error`` metadata)."""
        return f"FS_ERROR_{self.name}"


class FsError(Exception):
    """Base: a failed file-system call (nothing changed)."""

    fs_code: FsCode = FsCode.INVALID_ARGUMENT

    def __init__(self, message: str, code: FsCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.fs_code = code

    def trailing_metadata(self) -> Sequence[tuple[str, str]]:
        """What the RPC layer sends with the status: the FsError name."""
        return ((FS_ERROR_METADATA, self.fs_code.wire_name),)


class FsNotFound(FsError):
    """ENOENT."""

    fs_code = FsCode.NOT_FOUND


class FsExists(FsError):
    """EEXIST."""

    fs_code = FsCode.EXISTS


class FsPrecondition(FsError):
    """ENOTDIR, EISDIR, ENOTEMPTY, ELOOP, EMLINK, EBADF, EBUSY."""


class FsInvalid(FsError):
    """EINVAL, ENAMETOOLONG, rename loop."""


class FsDenied(FsError):
    """EACCES, EPERM."""


class FsExhausted(FsError):
    """EDQUOT, ENOSPC."""


class StorageUnavailable(FsError):
    """Storage could not answer (exact length, chunk removal): the call may be retried."""

    fs_code = FsCode.CONFLICT


_CLASS_OF = {
    FsCode.NOT_FOUND: FsNotFound, FsCode.EXISTS: FsExists, FsCode.ACCESS_DENIED: FsDenied,
    FsCode.NOT_PERMITTED: FsDenied, FsCode.NAME_TOO_LONG: FsInvalid, FsCode.INVALID_ARGUMENT: FsInvalid,
    FsCode.RENAME_LOOP: FsInvalid, FsCode.QUOTA_EXCEEDED: FsExhausted, FsCode.NO_SPACE: FsExhausted,
}  # fmt: skip


def fs_error(code: FsCode, message: str) -> FsError:
    """The exception for ``code`` (its class decides the gRPC status)."""
    return _CLASS_OF.get(code, FsPrecondition)(message, code)
