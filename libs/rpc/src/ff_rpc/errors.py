"""One error-to-status mapping for every service, and the typed error clients raise."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc


class ServiceError(Exception):
    """Base of the errors ff_rpc itself raises; services map their own hierarchies with a StatusTable."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def trailing_metadata(self) -> Sequence[tuple[str, str]]:
        """Extra trailing metadata sent with the error status (e.g. where the primary is)."""
        return ()


class InvalidArgument(ServiceError):
    """The request is malformed or out of range, whatever the state: sending it again will not help."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    """What the request names (a node, a file, a token) does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ServiceError):
    """What the request would create exists already."""

    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ServiceError):
    """The system is not in the state the request needs; sending it again unchanged will not help until it is."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(ServiceError):
    """A compare-and-set lost: the caller's version is stale. Re-read, then retry."""

    code = grpc.StatusCode.ABORTED


class Unauthenticated(ServiceError):
    """No token, a malformed one, or one the identity registry does not accept."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ServiceError):
    """The caller is known but may not do this (an admin or cluster RPC, another user's file)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(ServiceError):
    """The service cannot answer now (a dependency down or unreachable); trying again later may succeed."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(ServiceError):
    """A quota or a limit is reached (space, inodes, request size)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class StatusTable:
    """Maps exception types to status codes by the exception's class hierarchy (nearest class wins).

    ServiceError subclasses carry their own code; a service adds its domain exceptions (which live in
    ``core/`` and know nothing of grpc) with ``StatusTable({NodeNotFound: NOT_FOUND, ...})``.
    Anything unmapped is INTERNAL: nothing escapes as UNKNOWN.
    """

    def __init__(self, codes: Mapping[type[BaseException], grpc.StatusCode] | None = None) -> None:
        self._codes = dict(codes or {})

    def code_for(self, exc: BaseException) -> grpc.StatusCode | None:
        """The status for ``exc``, or None when it is an unexpected (internal) error."""
        for cls in type(exc).__mro__:
            if cls in self._codes:
                return self._codes[cls]
            if cls is ServiceError:
                return exc.code  # type: ignore[attr-defined, no-any-return]
        return None

    def merged(self, other: StatusTable) -> StatusTable:
        """A table with both tables' entries; ``other``'s wins for a class both map."""
        return StatusTable({**self._codes, **other._codes})


class RpcError(Exception):
    """What every client helper raises: one typed error with the status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.trailing_metadata = dict(trailing_metadata or {})

    @classmethod
    def from_grpc(cls, err: grpc.aio.AioRpcError) -> RpcError:
        """The error for a failed grpc.aio call, its trailing metadata decoded to text."""
        trailing = err.trailing_metadata() or ()
        md = {str(k): v if isinstance(v, str) else v.decode() for k, v in trailing}
        return cls(err.code(), err.details() or "", md)
