"""Users, groups and tokens (the cluster's identity registry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from ff_mgmtd.core.errors import AlreadyExistsError, Conflict, InvalidToken, NotFoundError
from ff_mgmtd.core.model import Group, Role, TokenInfo, User
from ff_mgmtd.core.tokens import NewToken, parse_token, secret_matches
from ff_mgmtd.core.validation import MAX_POSIX_ID
from ff_mgmtd.store.cluster_state import Fence, check_fence, next_free_id
from ff_mgmtd.store.schema import group_members, groups, tokens, users

FIRST_UID = 1000
FIRST_GID = 1000


def _groups_of(s: Session, uid: int) -> list[tuple[int, str]]:
    stmt = (
        select(groups.c.gid, groups.c.name)
        .join(group_members, group_members.c.gid == groups.c.gid)
        .where(group_members.c.uid == uid)
        .order_by(groups.c.gid)
    )
    return [(int(g), str(n)) for g, n in s.execute(stmt)]


def _user(s: Session, row: Any) -> User:
    member_of = _groups_of(s, int(row.uid))
    return User(
        uid=int(row.uid),
        name=row.name,
        role=Role(row.role),
        disabled=bool(row.disabled),
        group_names=tuple(n for _, n in member_of),
        gids=tuple(g for g, _ in member_of),
        created_at=float(row.created_at),
    )


def get_user(s: Session, name: str) -> User:
    """The user called ``name``; NotFoundError when there is none."""
    row = s.execute(select(users).where(users.c.name == name)).first()
    if row is None:
        raise NotFoundError(f"user {name!r} does not exist")
    return _user(s, row)


def list_users(s: Session) -> list[User]:
    """Every user, by uid."""
    return [_user(s, r) for r in s.execute(select(users).order_by(users.c.uid)).all()]


def create_user(s: Session, fence: Fence, name: str, uid: int, role: Role, group_names: list[str], now: float) -> User:
    """Create a user in the named groups; ``uid`` 0 takes the next free one from ``FIRST_UID``.

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        AlreadyExistsError: the name or the uid is taken.
        NotFoundError: a group does not exist.
        NoFreeId: every uid is taken.
    """
    check_fence(s, fence)
    if s.execute(select(users.c.uid).where(users.c.name == name)).first() is not None:
        raise AlreadyExistsError(f"user {name!r} already exists")
    gids = [get_group(s, g).gid for g in group_names]
    if uid:
        if s.execute(select(users.c.uid).where(users.c.uid == uid)).first() is not None:
            raise AlreadyExistsError(f"uid {uid} is taken")
    else:
        uid = next_free_id(s, users.c.uid, FIRST_UID, MAX_POSIX_ID)
    s.execute(insert(users).values(uid=uid, name=name, role=int(role), disabled=False, created_at=now))
    for gid in gids:
        s.execute(insert(group_members).values(gid=gid, uid=uid))
    return get_user(s, name)


def set_user_disabled(s: Session, fence: Fence, name: str, disabled: bool) -> User:
    """Disable (or enable again) a user: a disabled user's tokens stop authenticating.

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        NotFoundError: there is no such user.
    """
    check_fence(s, fence)
    get_user(s, name)
    s.execute(update(users).where(users.c.name == name).values(disabled=disabled))
    return get_user(s, name)


def get_group(s: Session, name: str) -> Group:
    """The group called ``name`` with its members; NotFoundError when there is none."""
    row = s.execute(select(groups).where(groups.c.name == name)).first()
    if row is None:
        raise NotFoundError(f"group {name!r} does not exist")
    stmt = (
        select(users.c.name)
        .join(group_members, group_members.c.uid == users.c.uid)
        .where(group_members.c.gid == row.gid)
        .order_by(users.c.name)
    )
    return Group(gid=int(row.gid), name=row.name, member_names=tuple(s.execute(stmt).scalars().all()))


def list_groups(s: Session) -> list[Group]:
    """Every group with its members, by gid."""
    names = s.execute(select(groups.c.name).order_by(groups.c.gid)).scalars().all()
    return [get_group(s, n) for n in names]


def create_group(s: Session, fence: Fence, name: str, gid: int) -> Group:
    """Create an empty group; ``gid`` 0 takes the next free one from ``FIRST_GID``.

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        AlreadyExistsError: the name or the gid is taken.
        NoFreeId: every gid is taken.
    """
    check_fence(s, fence)
    if s.execute(select(groups.c.gid).where(groups.c.name == name)).first() is not None:
        raise AlreadyExistsError(f"group {name!r} already exists")
    if gid:
        if s.execute(select(groups.c.gid).where(groups.c.gid == gid)).first() is not None:
            raise AlreadyExistsError(f"gid {gid} is taken")
    else:
        gid = next_free_id(s, groups.c.gid, FIRST_GID, MAX_POSIX_ID)
    s.execute(insert(groups).values(gid=gid, name=name))
    return get_group(s, name)


def set_membership(s: Session, fence: Fence, group_name: str, user_name: str, member: bool) -> Group:
    """Add a user to a group or take them out (idempotent); returns the group as it is now.

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        NotFoundError: the group or the user does not exist.
    """
    check_fence(s, fence)
    group, user = get_group(s, group_name), get_user(s, user_name)
    is_member = user_name in group.member_names
    if member and not is_member:
        s.execute(insert(group_members).values(gid=group.gid, uid=user.uid))
    elif not member and is_member:
        s.execute(delete(group_members).where(group_members.c.gid == group.gid, group_members.c.uid == user.uid))
    return get_group(s, group_name)


def _token_info(row: Any, user_name: str) -> TokenInfo:
    return TokenInfo(
        token_id=row.token_id,
        user_name=user_name,
        description=row.description,
        created_at=float(row.created_at),
        expires_at=float(row.expires_at),
        revoked=bool(row.revoked_at),
    )


def issue_token(
    s: Session, fence: Fence, user_name: str, new: NewToken, description: str, ttl_s: float, now: float
) -> TokenInfo:
    """Store a token made by ``core.tokens.new_token`` for a user; ``ttl_s`` 0: it never expires.

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        NotFoundError: there is no such user.
    """
    check_fence(s, fence)
    user = get_user(s, user_name)
    s.execute(
        insert(tokens).values(
            token_id=new.token_id,
            uid=user.uid,
            secret_hash=new.secret_hash,
            description=description,
            created_at=now,
            expires_at=now + ttl_s if ttl_s else 0.0,
            revoked_at=0.0,
        )
    )
    return get_token(s, new.token_id)


def get_token(s: Session, token_id: str) -> TokenInfo:
    """A token's public facts by id; NotFoundError when there is none."""
    stmt = select(tokens, users.c.name).join(users, users.c.uid == tokens.c.uid).where(tokens.c.token_id == token_id)
    row = s.execute(stmt).first()
    if row is None:
        raise NotFoundError(f"token {token_id!r} does not exist")
    return _token_info(row, row.name)


def list_tokens(s: Session, user_name: str) -> list[TokenInfo]:
    """Every token of a user, revoked and expired ones too, oldest first; NotFoundError for no such user."""
    user = get_user(s, user_name)
    rows = s.execute(select(tokens).where(tokens.c.uid == user.uid).order_by(tokens.c.created_at)).all()
    return [_token_info(r, user_name) for r in rows]


def revoke_token(s: Session, fence: Fence, token_id: str, now: float) -> TokenInfo:
    """Revoke a token at ``now`` (idempotent: a revoked token keeps its first revocation time).

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        NotFoundError: there is no such token.
    """
    check_fence(s, fence)
    info = get_token(s, token_id)
    if not info.revoked:
        s.execute(update(tokens).where(tokens.c.token_id == token_id).values(revoked_at=now))
    return get_token(s, token_id)


def authenticate(s: Session, token: str, now: float) -> tuple[User, float]:
    """The user a bearer token belongs to and when the token expires (0: never).

    InvalidToken for anything but a live token of an enabled user.
    """
    token_id, presented = parse_token(token)
    row = s.execute(select(tokens).where(tokens.c.token_id == token_id)).first()
    if row is None or not secret_matches(row.secret_hash, presented):
        raise InvalidToken("unknown token")
    if row.revoked_at:
        raise InvalidToken("token revoked")
    if row.expires_at and row.expires_at <= now:
        raise InvalidToken("token expired")
    user_row = s.execute(select(users).where(users.c.uid == row.uid)).first()
    if user_row is None or user_row.disabled:
        raise InvalidToken("user disabled")
    return _user(s, user_row), float(row.expires_at)


@dataclass(frozen=True, kw_only=True)
class AdminImport:
    """What ``import_admin_token`` found and did."""

    user: User
    token: TokenInfo
    user_created: bool
    promoted: bool  # the user existed without the admin role
    token_created: bool


def import_admin_token(
    s: Session, user_name: str, token_id: str, secret_hash: str, description: str, now: float
) -> AdminImport:
    """Make ``user_name`` an admin holding the token ``token_id`` (its secret's hash), creating what is missing.

    Not fenced: every mgmtd instance runs it at start, primary or not, before it campaigns. It converges: each run
    leaves the same rows, and concurrent runs serialize (the loser's transaction is retried and finds the winner's
    rows). An existing user gets the admin role if it lacks it; a disabled one stays disabled. A token already stored
    under ``token_id`` is left as it is (a revoked one stays revoked) when it is this user's with this secret.

    Raises:
        Conflict: ``token_id`` is stored for another user or with another secret (nothing changes).
        NoFreeId: the user is new and every uid is taken.
    """
    row = s.execute(select(users).where(users.c.name == user_name)).first()
    promoted = row is not None and Role(row.role) is not Role.ADMIN
    if row is None:
        uid = next_free_id(s, users.c.uid, FIRST_UID, MAX_POSIX_ID)
        s.execute(insert(users).values(uid=uid, name=user_name, role=int(Role.ADMIN), disabled=False, created_at=now))
    elif promoted:
        s.execute(update(users).where(users.c.name == user_name).values(role=int(Role.ADMIN)))
    user = get_user(s, user_name)
    stored = s.execute(select(tokens).where(tokens.c.token_id == token_id)).first()
    if stored is None:
        s.execute(
            insert(tokens).values(
                token_id=token_id,
                uid=user.uid,
                secret_hash=secret_hash,
                description=description,
                created_at=now,
                expires_at=0.0,
                revoked_at=0.0,
            )
        )
    elif int(stored.uid) != user.uid or not secret_matches(stored.secret_hash, secret_hash):
        raise Conflict(f"token id {token_id} is already stored for another user or with another secret")
    return AdminImport(
        user=user,
        token=get_token(s, token_id),
        user_created=row is None,
        promoted=promoted,
        token_created=stored is None,
    )
