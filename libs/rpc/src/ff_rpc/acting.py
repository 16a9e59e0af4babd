"""Acting for another user: a trusted caller (an admin or cluster token) runs one call as a POSIX uid and groups.

A FUSE mount that serves every user of a machine holds one token, but each request comes from some process
with its own uid and groups; the mount sends them in the ``ff-act-as`` header (``uid:gid,gid,...``, the first
gid the primary one) and the server checks the call as that user. Only a principal that could do everything
anyway may ask (an admin or the cluster): a user token that sends the header is refused, never downgraded, so a
user's mount cannot reach another user's files by naming their uid. Acting as uid 0 is root (admin);
any other uid is a plain user with exactly the groups sent.

Clients set the identity with ``acting_as(...)`` around their calls (a context variable read by
``RpcClient``); servers turn the header into the principal in the interceptor.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from ff_rpc.auth import Principal, Role
from ff_rpc.errors import InvalidArgument, PermissionDenied

ACT_AS_HEADER = "ff-act-as"
MAX_ID = (1 << 32) - 2  # (uid_t)-1 means "no change" to chown, never an identity
MAX_GROUPS = 65536  # NGROUPS_MAX on Linux


@dataclass(frozen=True)
class Identity:
    """A POSIX caller: uid and groups (the primary gid first)."""

    uid: int
    gids: tuple[int, ...]

    def header(self) -> str:
        """The ``ff-act-as`` header value, ``uid:gid,gid,...``, which ``parse_identity`` reads back."""
        return f"{self.uid}:{','.join(str(g) for g in self.gids)}"


_acting: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("ff_acting_as", default=None)


def current_acting() -> Identity | None:
    """The identity calls made in this context act as (None: the token's own user)."""
    return _acting.get()


@contextlib.contextmanager
def acting_as(identity: Identity | None) -> Iterator[None]:
    """Calls made inside run as ``identity`` (None: as the token's own user)."""
    token = _acting.set(identity)
    try:
        yield
    finally:
        _acting.reset(token)


def _id(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_ID:
        raise InvalidArgument(f"{ACT_AS_HEADER}: {text!r} is not a uid/gid (0..{MAX_ID})")
    return int(text)


def parse_identity(value: str) -> Identity:
    """``uid:gid,gid,...`` -> Identity; malformed -> InvalidArgument."""
    uid, sep, gids = value.partition(":")
    if not sep:
        raise InvalidArgument(f"{ACT_AS_HEADER} must be 'uid:gid[,gid...]', not {value[:80]!r}")
    groups = tuple(_id(g) for g in gids.split(",")) if gids else ()
    if len(groups) > MAX_GROUPS:
        raise InvalidArgument(f"{ACT_AS_HEADER}: more than {MAX_GROUPS} groups")
    return Identity(_id(uid), groups)


def acting_principal(principal: Principal, value: str) -> Principal:
    """The principal a call runs as when ``principal`` sent ``ff-act-as: value``.

    Raises:
        PermissionDenied: ``principal`` is not an admin or the cluster.
        InvalidArgument: the header is malformed.
    """
    if not principal.is_admin:
        raise PermissionDenied(f"user {principal.name!r} may not act for other users ({ACT_AS_HEADER} needs an admin)")
    who = parse_identity(value)
    return Principal(
        uid=who.uid,
        name=f"{principal.name} as uid {who.uid}",
        role=Role.ADMIN if who.uid == 0 else Role.USER,
        gids=who.gids,
    )
