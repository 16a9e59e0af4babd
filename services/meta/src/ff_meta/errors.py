"""Meta's exceptions to gRPC status codes (each FsError also sends ``ff-fs-error``)."""

from __future__ import annotations

import grpc

from ff_meta.core import errors
from ff_rpc import StatusTable
from ff_store import TransactionConflict

STATUS_TABLE = StatusTable({
    errors.FsNotFound: grpc.StatusCode.NOT_FOUND,
    errors.FsExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FsPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.FsInvalid: grpc.StatusCode.INVALID_ARGUMENT,
    errors.FsDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.FsExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FsError: grpc.StatusCode.ABORTED,
    TransactionConflict: grpc.StatusCode.ABORTED,
})  # fmt: skip
