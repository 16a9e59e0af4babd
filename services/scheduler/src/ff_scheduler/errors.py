"""The one table from the scheduler's exceptions to gRPC status codes."""

from __future__ import annotations

import grpc

from ff_rpc import StatusTable
from ff_scheduler.core import errors

STATUS_TABLE = StatusTable(
    {
        errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
        errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
        errors.Forbidden: grpc.StatusCode.PERMISSION_DENIED,
        errors.Conflict: grpc.StatusCode.FAILED_PRECONDITION,
        errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    }
)
