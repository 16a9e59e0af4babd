"""The one table from mgmtd's exceptions to gRPC status codes."""

from __future__ import annotations

import grpc
from sqlalchemy.exc import OperationalError

from ff_mgmtd.core import errors
from ff_rpc import StatusTable
from ff_store import TransactionConflict

STATUS_TABLE = StatusTable({
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    errors.StaleVersion: grpc.StatusCode.ABORTED,
    errors.Conflict: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    errors.InvalidToken: grpc.StatusCode.UNAUTHENTICATED,
    errors.NotPrimary: grpc.StatusCode.UNAVAILABLE,
    errors.NoFreeId: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # The database: conflicts past the retries, or a lost connection. Nothing was changed.
    TransactionConflict: grpc.StatusCode.UNAVAILABLE,
    OperationalError: grpc.StatusCode.UNAVAILABLE,
})  # fmt: skip
