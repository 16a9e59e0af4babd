"""Bearer tokens: who the caller is (Principal), the access rule of each RPC, and token caches."""

from __future__ import annotations

import contextvars
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from google.protobuf import descriptor_pool

from ff_rpc.errors import PermissionDenied, Unauthenticated
from fireflyer.common.v1 import common_pb2

AUTHORIZATION_HEADER = "authorization"
BEARER_PREFIX = "Bearer "
CLUSTER_PRINCIPAL_NAME = "cluster"


class Access(IntEnum):
    """Mirror of fireflyer.common.v1.Access: who may call an RPC."""

    PUBLIC = common_pb2.ACCESS_PUBLIC
    USER = common_pb2.ACCESS_USER
    ADMIN = common_pb2.ACCESS_ADMIN
    CLUSTER = common_pb2.ACCESS_CLUSTER


class Role(IntEnum):
    """Mirror of fireflyer.common.v1.Role: what a user token may do (ADMIN passes ACCESS_ADMIN checks)."""

    USER = common_pb2.ROLE_USER
    ADMIN = common_pb2.ROLE_ADMIN


@dataclass(frozen=True, kw_only=True)
class Principal:
    """An authenticated caller."""

    uid: int
    name: str
    role: Role = Role.USER
    gids: tuple[int, ...] = ()
    group_names: tuple[str, ...] = ()
    is_cluster: bool = False

    @property
    def is_admin(self) -> bool:
        """True for an admin user and for the cluster itself (cluster services may do what an admin may)."""
        return self.is_cluster or self.role is Role.ADMIN

    def to_proto(self) -> common_pb2.Principal:
        """The wire form, as mgmtd answers ValidateToken and WhoAmI."""
        return common_pb2.Principal(
            uid=self.uid,
            name=self.name,
            role=common_pb2.Role.ValueType(self.role),
            gids=self.gids,
            group_names=self.group_names,
            is_cluster=self.is_cluster,
        )

    @classmethod
    def from_proto(cls, msg: common_pb2.Principal) -> Principal:
        """The principal a wire message describes; an unset role reads as USER."""
        return cls(
            uid=msg.uid,
            name=msg.name,
            role=Role(msg.role or common_pb2.ROLE_USER),
            gids=tuple(msg.gids),
            group_names=tuple(msg.group_names),
            is_cluster=msg.is_cluster,
        )


CLUSTER_PRINCIPAL = Principal(uid=0, name=CLUSTER_PRINCIPAL_NAME, role=Role.ADMIN, is_cluster=True)

_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("ff_principal", default=None)


def current_principal() -> Principal:
    """The caller of the RPC being served (set by the server interceptor)."""
    principal = _principal.get()
    if principal is None:
        raise Unauthenticated("no authenticated caller in this context")
    return principal


def set_current_principal(principal: Principal | None) -> contextvars.Token[Principal | None]:
    """Makes ``principal`` the caller for this context (its task and what it spawns); for servers, not handlers.

    The gRPC interceptor sets it per call; a server with its own transport (storage's data server) per connection.
    """
    return _principal.set(principal)


# Standard services every server carries that need no token (health probes, grpcurl's listing).
OPEN_SERVICES = frozenset(
    {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"}
)


def method_access(full_method: str) -> Access | None:
    """The access rule declared in the proto for ``/pkg.Service/Method``; None for the open services.

    Anything else without the option (unknown methods, other packages) is CLUSTER-only: fail closed.
    """
    service, _, method = full_method.lstrip("/").partition("/")
    if service in OPEN_SERVICES:
        return None
    try:
        desc = descriptor_pool.Default().FindMethodByName(f"{service}.{method}")
    except KeyError:
        return Access.CLUSTER
    value = desc.GetOptions().Extensions[common_pb2.access]
    return Access(value) if value else Access.CLUSTER


def authorize(access: Access, principal: Principal) -> None:
    """Raise PermissionDenied when ``principal`` may not call an RPC declared with ``access``."""
    if access is Access.CLUSTER and not principal.is_cluster:
        raise PermissionDenied("this call is reserved to cluster services")
    if access is Access.ADMIN and not principal.is_admin:
        raise PermissionDenied(f"user {principal.name!r} is not an admin")


def bearer_token(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    """The token of the ``authorization: Bearer <token>`` entry of a call's metadata; None when there is none.

    Raises:
        Unauthenticated: an ``authorization`` entry of another scheme.
    """
    for key, value in metadata or ():
        if key == AUTHORIZATION_HEADER:
            text = value.decode() if isinstance(value, bytes) else value
            if not text.startswith(BEARER_PREFIX):
                raise Unauthenticated("authorization metadata must be 'Bearer <token>'")
            return text[len(BEARER_PREFIX) :].strip()
    return None


def is_cluster_token(token: str, cluster_token: str) -> bool:
    """True when ``token`` is the cluster's (never when none is configured); constant-time, so timing tells nothing."""
    return bool(cluster_token) and hmac.compare_digest(token.encode(), cluster_token.encode())


class TokenValidator(Protocol):
    """Turns a bearer token into a Principal, or raises Unauthenticated (what the interceptor calls)."""

    async def validate(self, token: str) -> Principal:
        """The caller ``token`` stands for; raises Unauthenticated when it stands for none."""


@dataclass(frozen=True)
class TokenCheck:
    """A registry's answer for a token, and how long it may be cached (never past the token's expiry)."""

    principal: Principal
    valid_for_s: float


class TokenChecker(Protocol):
    """Asks the identity registry about a token; raises Unauthenticated for a bad one."""

    async def check(self, token: str) -> TokenCheck:
        """The registry's answer for ``token``; raises Unauthenticated for a bad one, Unavailable when it cannot ask."""


@dataclass
class _CacheEntry:
    expires_at: float
    principal: Principal | None
    error: str = ""


@dataclass
class CachingTokenValidator:
    """Caches a registry's answers briefly, so a busy service does not ask mgmtd on every call.

    An answer is kept for the shorter of ``ttl_s`` and what the registry allows (which stops at the
    token's own expiry); rejections for ``negative_ttl_s``. A revoked token stays valid here for at
    most ``ttl_s``. Least recently used entries go first when the cache is full, so a flood of junk
    tokens cannot flush the good ones all at once.
    """

    inner: TokenChecker
    ttl_s: float = 5.0
    negative_ttl_s: float = 1.0
    max_entries: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _entries: OrderedDict[str, _CacheEntry] = field(default_factory=OrderedDict)

    async def validate(self, token: str) -> Principal:
        """The caller ``token`` stands for, from the cache or else the registry.

        Raises:
            Unauthenticated: the registry refused the token (now, or within ``negative_ttl_s``).
            Unavailable: the registry could not be asked (not cached: the next call asks again).
        """
        now = self.clock()
        entry = self._entries.get(token)
        if entry is None or entry.expires_at <= now:
            entry = await self._fetch(token, now)
        else:
            self._entries.move_to_end(token)
        if entry.principal is None:
            raise Unauthenticated(entry.error)
        return entry.principal

    async def _fetch(self, token: str, now: float) -> _CacheEntry:
        try:
            answer = await self.inner.check(token)
        except Unauthenticated as exc:
            entry = _CacheEntry(now + self.negative_ttl_s, None, str(exc))
        else:
            entry = _CacheEntry(now + max(0.0, min(self.ttl_s, answer.valid_for_s)), answer.principal)
        self._entries[token] = entry
        self._entries.move_to_end(token)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return entry

    def invalidate(self) -> None:
        """Forgets every answer, so a token revoked or a role changed just now is not served from the cache."""
        self._entries.clear()
