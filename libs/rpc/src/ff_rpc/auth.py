"""Bearer tokens: who the caller is (Principal), the access rule of each RPC, and token caches."""

from __future__ import annotations

import contextvars
import hmac
import time
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
        return self.is_cluster or self.role is Role.ADMIN

    def to_proto(self) -> common_pb2.Principal:
        return common_pb2.Principal(
            uid=self.uid, name=self.name, role=common_pb2.Role.ValueType(self.role), gids=self.gids,
            group_names=self.group_names, is_cluster=self.is_cluster,
        )  # fmt: skip

    @classmethod
    def from_proto(cls, msg: common_pb2.Principal) -> Principal:
        return cls(
            uid=msg.uid, name=msg.name, role=Role(msg.role or common_pb2.ROLE_USER), gids=tuple(msg.gids),
            group_names=tuple(msg.group_names), is_cluster=msg.is_cluster,
        )  # fmt: skip


CLUSTER_PRINCIPAL = Principal(uid=0, name=CLUSTER_PRINCIPAL_NAME, role=Role.ADMIN, is_cluster=True)

_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("ff_principal", default=None)


def current_principal() -> Principal:
    """The caller of the RPC being served (set by the server interceptor)."""
    principal = _principal.get()
    if principal is None:
        raise Unauthenticated("no authenticated caller in this context")
    return principal


def set_current_principal(principal: Principal | None) -> contextvars.Token[Principal | None]:
    return _principal.set(principal)


def method_access(full_method: str) -> Access | None:
    """The access rule declared in the proto for ``/pkg.Service/Method``; None for non-fireflyer methods.

    A fireflyer method without the option is treated as CLUSTER-only: fail closed.
    """
    service, _, method = full_method.lstrip("/").partition("/")
    if not service.startswith("fireflyer."):
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
    for key, value in metadata or ():
        if key == AUTHORIZATION_HEADER:
            text = value.decode() if isinstance(value, bytes) else value
            if not text.startswith(BEARER_PREFIX):
                raise Unauthenticated("authorization metadata must be 'Bearer <token>'")
            return text[len(BEARER_PREFIX) :].strip()
    return None


def is_cluster_token(token: str, cluster_token: str) -> bool:
    return bool(cluster_token) and hmac.compare_digest(token.encode(), cluster_token.encode())


class TokenValidator(Protocol):
    """Turns a bearer token into a Principal, or raises Unauthenticated."""

    async def validate(self, token: str) -> Principal: ...


@dataclass
class _CacheEntry:
    expires_at: float
    principal: Principal | None
    error: str = ""


@dataclass
class CachingTokenValidator:
    """Caches another validator's answers briefly, so a busy service does not ask mgmtd per call.

    Rejections are cached too (shorter), so a client hammering with a bad token costs little. A revoked
    token stays valid here for at most ``ttl_s``.
    """

    inner: TokenValidator
    ttl_s: float = 5.0
    negative_ttl_s: float = 1.0
    max_entries: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, _CacheEntry] = field(default_factory=dict)

    async def validate(self, token: str) -> Principal:
        now = self.clock()
        entry = self._entries.get(token)
        if entry is None or entry.expires_at <= now:
            entry = await self._fetch(token, now)
        if entry.principal is None:
            raise Unauthenticated(entry.error)
        return entry.principal

    async def _fetch(self, token: str, now: float) -> _CacheEntry:
        if len(self._entries) >= self.max_entries:
            self._entries = {k: v for k, v in self._entries.items() if v.expires_at > now}
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
        try:
            principal = await self.inner.validate(token)
        except Unauthenticated as exc:
            entry = _CacheEntry(now + self.negative_ttl_s, None, str(exc))
        else:
            entry = _CacheEntry(now + self.ttl_s, principal)
        self._entries[token] = entry
        return entry

    def invalidate(self) -> None:
        self._entries.clear()
