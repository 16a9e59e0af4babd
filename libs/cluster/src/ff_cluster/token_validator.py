"""Token validation for every service but mgmtd: ask mgmtd's identity registry (cache it briefly)."""

from __future__ import annotations

import grpc

from ff_cluster.mgmtd_client import MgmtdClient
from ff_rpc import CachingTokenValidator, Principal, RpcError, Unauthenticated, Unavailable
from fireflyer.mgmtd.v1 import mgmtd_pb2


class MgmtdTokenValidator:
    """Calls IdentityService.ValidateToken with the cluster token."""

    def __init__(self, client: MgmtdClient) -> None:
        self._client = client

    async def validate(self, token: str) -> Principal:
        try:
            resp = await self._client.identity(lambda s: s.ValidateToken, mgmtd_pb2.ValidateTokenRequest(token=token))
        except RpcError as err:
            if err.code is grpc.StatusCode.UNAUTHENTICATED:
                raise Unauthenticated(err.details) from None
            raise Unavailable(f"cannot validate the token: mgmtd answered {err.code.name}") from None
        return Principal.from_proto(resp.principal)


def registry_validator(client: MgmtdClient, ttl_s: float = 5.0) -> CachingTokenValidator:
    """What a service passes to its RpcServer: mgmtd's answers, cached for ``ttl_s``."""
    return CachingTokenValidator(MgmtdTokenValidator(client), ttl_s=ttl_s)
