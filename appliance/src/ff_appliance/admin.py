"""Identity administration through mgmtd: users, groups, tokens, whoami; and the first admin token."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import grpc

from ff_appliance.state import StateDir, read_secret, write_secret
from ff_appliance.status import format_table
from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb

ADMIN_USER = "admin"


@contextlib.asynccontextmanager
async def connect(addresses: Sequence[str], token: str, timeout_s: float = 5.0) -> AsyncIterator[MgmtdClient]:
    """A client of the primary mgmtd, closed on exit."""
    client = MgmtdClient(list(addresses), token=token, timeout_s=timeout_s)
    try:
        yield client
    finally:
        await client.close()


# ---- calls (each returns the response message, printed by a render_* function or as JSON) ----


async def user_add(
    client: MgmtdClient, name: str, *, admin: bool = False, uid: int = 0, groups: Sequence[str] = ()
) -> pb.CreateUserResponse:
    """Create a user; ``uid`` 0 takes the next free one, ``groups`` must exist (admin only: PERMISSION_DENIED else)."""
    role = common_pb2.ROLE_ADMIN if admin else common_pb2.ROLE_USER
    request = pb.CreateUserRequest(name=name, uid=uid, role=role, group_names=list(groups))
    resp: pb.CreateUserResponse = await client.identity.create_user(request)
    return resp


async def user_list(client: MgmtdClient) -> pb.ListUsersResponse:
    """Every user of the cluster (admin only)."""
    resp: pb.ListUsersResponse = await client.identity.list_users(pb.ListUsersRequest())
    return resp


async def user_set_disabled(client: MgmtdClient, name: str, *, disabled: bool) -> pb.SetUserDisabledResponse:
    """Disable or re-enable a user; a disabled user's tokens are refused until it is enabled again (admin only)."""
    request = pb.SetUserDisabledRequest(name=name, disabled=disabled)
    resp: pb.SetUserDisabledResponse = await client.identity.set_user_disabled(request)
    return resp


async def group_add(client: MgmtdClient, name: str, *, gid: int = 0) -> pb.CreateGroupResponse:
    """Create a group; ``gid`` 0 takes the next free one (admin only)."""
    resp: pb.CreateGroupResponse = await client.identity.create_group(pb.CreateGroupRequest(name=name, gid=gid))
    return resp


async def group_list(client: MgmtdClient) -> pb.ListGroupsResponse:
    """Every group with its members (admin only)."""
    resp: pb.ListGroupsResponse = await client.identity.list_groups(pb.ListGroupsRequest())
    return resp


async def group_add_member(client: MgmtdClient, group: str, user: str) -> pb.AddGroupMemberResponse:
    """Add an existing user to an existing group (admin only)."""
    request = pb.AddGroupMemberRequest(group_name=group, user_name=user)
    resp: pb.AddGroupMemberResponse = await client.identity.add_group_member(request)
    return resp


async def group_remove_member(client: MgmtdClient, group: str, user: str) -> pb.RemoveGroupMemberResponse:
    """Take a user out of a group (admin only)."""
    request = pb.RemoveGroupMemberRequest(group_name=group, user_name=user)
    resp: pb.RemoveGroupMemberResponse = await client.identity.remove_group_member(request)
    return resp


async def token_issue(
    client: MgmtdClient, user: str = "", *, ttl_s: float = 0.0, description: str = ""
) -> pb.IssueTokenResponse:
    """Issue a token for ``user`` ("": the caller); ``ttl_s`` 0 never expires.

    The response holds the secret, which mgmtd keeps only hashed: it cannot be shown again. Users may issue
    tokens for themselves only; admins for anyone.
    """
    request = pb.IssueTokenRequest(user_name=user, ttl_s=ttl_s, description=description)
    resp: pb.IssueTokenResponse = await client.identity.issue_token(request)
    return resp


async def token_list(client: MgmtdClient, user: str = "") -> pb.ListTokensResponse:
    """The tokens of ``user`` ("": the caller), never their secrets; users see only their own."""
    resp: pb.ListTokensResponse = await client.identity.list_tokens(pb.ListTokensRequest(user_name=user))
    return resp


async def token_revoke(client: MgmtdClient, token_id: str) -> pb.RevokeTokenResponse:
    """Revoke a token by id; it is refused from then on. Users revoke only their own tokens, admins any."""
    request = pb.RevokeTokenRequest(token_id=token_id)
    resp: pb.RevokeTokenResponse = await client.identity.revoke_token(request)
    return resp


async def whoami(client: MgmtdClient) -> pb.WhoAmIResponse:
    """The caller's identity as mgmtd resolved the client's token (UNAUTHENTICATED if it does not work)."""
    resp: pb.WhoAmIResponse = await client.identity.who_am_i(pb.WhoAmIRequest())
    return resp


# ---- rendering ----


def _role_name(role: int) -> str:
    return "admin" if role == common_pb2.ROLE_ADMIN else "user"


def render_user(user: pb.User) -> str:
    """One line: name, uid, role, enabled or disabled, groups."""
    groups = ",".join(user.group_names) or "-"
    state = "disabled" if user.disabled else "enabled"
    return f"user {user.name}: uid {user.uid}, role {_role_name(user.role)}, {state}, groups {groups}"


def render_users(users: Sequence[pb.User]) -> str:
    """The users as a table (uid, name, role, disabled, groups)."""
    rows = [[u.uid, u.name, _role_name(u.role), u.disabled, ",".join(u.group_names) or "-"] for u in users]
    return format_table(["uid", "name", "role", "disabled", "groups"], rows)


def render_group(group: pb.Group) -> str:
    """One line: name, gid, members."""
    return f"group {group.name}: gid {group.gid}, members {','.join(group.member_names) or '-'}"


def render_groups(groups: Sequence[pb.Group]) -> str:
    """The groups as a table (gid, name, members)."""
    rows = [[g.gid, g.name, ",".join(g.member_names) or "-"] for g in groups]
    return format_table(["gid", "name", "members"], rows)


def render_issued(resp: pb.IssueTokenResponse) -> str:
    """The issued token with its secret and a reminder that it is shown only this once."""
    info = resp.token_info
    return (
        f"token {info.token_id} issued to {info.user_name}, expires {_when(info.expires_at)}\n"
        "the secret is shown only now; keep it (e.g. FF_TOKEN=...):\n"
        f"secret: {resp.token}"
    )


def render_tokens(tokens: Sequence[pb.TokenInfo]) -> str:
    """The tokens as a table (id, user, created and expiry times in local time, revoked, description)."""
    rows = [
        [t.token_id, t.user_name, _when(t.created_at), _when(t.expires_at), t.revoked, t.description or "-"]
        for t in tokens
    ]
    return format_table(["token id", "user", "created", "expires", "revoked", "description"], rows)


def render_token(info: pb.TokenInfo) -> str:
    """One line: the token's id, its user and whether it is revoked."""
    return f"token {info.token_id} of {info.user_name}: {'revoked' if info.revoked else 'active'}"


def render_principal(principal: common_pb2.Principal) -> str:
    """Who a token speaks for: a user with uid, role and groups, or the cluster (the service-to-service token)."""
    if principal.is_cluster:
        return "cluster (the service-to-service token)"
    groups = ",".join(principal.group_names) or "-"
    return f"{principal.name} (uid {principal.uid}, role {_role_name(principal.role)}, groups {groups})"


def _when(unix_s: float) -> str:
    return "never" if unix_s <= 0 else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_s))


# ---- the first admin ----


async def ensure_admin_token(state: StateDir, addresses: Sequence[str], cluster_token: str) -> bool:
    """Make sure ``secrets/admin_token`` holds a working token of the ``admin`` user.

    Creates the user (role admin) with the cluster token if it does not exist, and issues a token when
    the file is missing or its token no longer works (e.g. revoked). Returns whether a token was issued.
    """
    saved = read_secret(state.admin_token_file)
    if saved is not None and await _token_works(addresses, saved):
        return False
    async with connect(addresses, cluster_token) as client:
        try:
            await user_add(client, ADMIN_USER, admin=True)
        except RpcError as err:
            if err.code is not grpc.StatusCode.ALREADY_EXISTS:
                raise
        issued = await token_issue(client, ADMIN_USER, description="admin token made by fireflyer up")
    write_secret(state.admin_token_file, issued.token)
    return True


async def _token_works(addresses: Sequence[str], token: str) -> bool:
    async with connect(addresses, token) as client:
        try:
            await whoami(client)
        except RpcError as err:
            if err.code is grpc.StatusCode.UNAUTHENTICATED:
                return False
            raise
    return True
