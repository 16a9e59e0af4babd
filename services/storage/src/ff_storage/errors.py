"""The one table from the storage service's exceptions to gRPC status codes."""

from __future__ import annotations

import grpc

from ff_rpc import StatusTable
from ff_storage.core import errors

STATUS_TABLE = StatusTable({
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotServing: grpc.StatusCode.UNAVAILABLE,
    errors.TooCostly: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.TargetNotFound: grpc.StatusCode.NOT_FOUND,
    errors.TargetExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    errors.ChunkCorrupt: grpc.StatusCode.DATA_LOSS,
    errors.PendingReplaced: grpc.StatusCode.ABORTED,
})  # fmt: skip
