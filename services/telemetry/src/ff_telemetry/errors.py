"""The one table from the collector's exceptions to gRPC status codes."""

from __future__ import annotations

import grpc

from ff_rpc import StatusTable
from ff_telemetry.core import errors

STATUS_TABLE = StatusTable(
    {
        errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
        errors.LimitExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
        errors.AlertsOff: grpc.StatusCode.FAILED_PRECONDITION,
        errors.UnknownSeries: grpc.StatusCode.NOT_FOUND,
        errors.StaleRegistration: grpc.StatusCode.FAILED_PRECONDITION,
        errors.NotYourSeries: grpc.StatusCode.PERMISSION_DENIED,
    }
)
