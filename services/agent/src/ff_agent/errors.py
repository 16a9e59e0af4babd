"""The one table from the agent's exceptions to gRPC status codes."""

from __future__ import annotations

import grpc

from ff_agent.core import errors
from ff_rpc import StatusTable

STATUS_TABLE = StatusTable(
    {
        errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
        errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
        errors.Busy: grpc.StatusCode.FAILED_PRECONDITION,
        errors.CannotRunAs: grpc.StatusCode.FAILED_PRECONDITION,
    }
)
