"""Token validation for every service but mgmtd: ask mgmtd's identity registry (cache it briefly)."""

from __future__ import annotations

import grpc

from ff_cluster.mgmtd_client import MgmtdClient
from ff_rpc import CachingTokenValidator, Principal, RpcError, TokenCheck, Unauthenticated, Unavailable
from fireflyer.mgmtd.v1 import mgmtd_pb2

# mgmtd's tokens are "fft_<16 hex>_<43 chars>"; anything else is refused here, without a call.
TOKEN_PREFIX = "fft_"
MAX_TOKEN_CHARS = 128


class MgmtdTokenValidator:
    """Calls IdentityService.ValidateToken with the cluster token."""

    def __init__(self, client: MgmtdClient) -> None:
        self._client = client

    async def validate(self, token: str) -> Principal:
        """The principal the token stands for, uncached (``registry_validator`` adds the cache).

        Raises:
            Unauthenticated: the token is malformed, or mgmtd does not accept it.
            Unavailable: mgmtd answered anything else (unreachable, no primary, ...).
        """
        return (await self.check(token)).principal

    async def check(self, token: str) -> TokenCheck:
        """The principal the token stands for and how long mgmtd lets the answer be cached; raises as ``validate``."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated("malformed token")
        try:
            resp = await self._client.identity.validate_token(mgmtd_pb2.ValidateTokenRequest(token=token))
        except RpcError as err:
            if err.code is grpc.StatusCode.UNAUTHENTICATED:
                raise Unauthenticated(err.details) from None
            raise Unavailable(f"cannot validate the token: mgmtd answered {err.code.name}") from None
        return TokenCheck(Principal.from_proto(resp.principal), resp.cache_ttl_s)


def registry_validator(client: MgmtdClient, ttl_s: float = 5.0) -> CachingTokenValidator:
    """What a service passes to its RpcServer: mgmtd's answers, cached for at most ``ttl_s``."""
    return CachingTokenValidator(MgmtdTokenValidator(client), ttl_s=ttl_s)
