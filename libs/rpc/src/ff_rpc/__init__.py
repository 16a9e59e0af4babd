"""Service runtime shared by every fireflyer service and client."""

from ff_rpc.acting import Identity, acting_as, current_acting
from ff_rpc.auth import (
    Access,
    CachingTokenValidator,
    Principal,
    Role,
    TokenCheck,
    TokenChecker,
    TokenValidator,
    current_principal,
)
from ff_rpc.client import ChannelInvoker, ChannelPool, ClientPool, RpcClient, connect, open_channel
from ff_rpc.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    RpcError,
    ServiceError,
    StatusTable,
    Unauthenticated,
    Unavailable,
)
from ff_rpc.logs import configure_logging, log_context
from ff_rpc.retry import RetriesExhausted, RetryPolicy, retry_call
from ff_rpc.server import RpcServer, ServerOptions, ServiceBinding, install_stop_signals, write_ready_file

__all__ = [
    "Aborted",
    "Access",
    "AlreadyExists",
    "CachingTokenValidator",
    "ChannelInvoker",
    "ChannelPool",
    "ClientPool",
    "FailedPrecondition",
    "Identity",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "Principal",
    "ResourceExhausted",
    "RetriesExhausted",
    "RetryPolicy",
    "Role",
    "RpcClient",
    "RpcError",
    "RpcServer",
    "ServerOptions",
    "ServiceBinding",
    "ServiceError",
    "StatusTable",
    "TokenCheck",
    "TokenChecker",
    "TokenValidator",
    "Unauthenticated",
    "Unavailable",
    "acting_as",
    "configure_logging",
    "connect",
    "current_acting",
    "current_principal",
    "install_stop_signals",
    "log_context",
    "open_channel",
    "retry_call",
    "write_ready_file",
]
