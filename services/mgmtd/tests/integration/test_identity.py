"""The identity registry: users, groups, roles, hashed tokens; and every service's view of callers."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import create_engine, text

from ff_cluster import MgmtdClient, MgmtdTokenValidator
from ff_rpc import RpcError, Unauthenticated
from ff_testing.mgmtd import InProcessMgmtd
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb


async def expect(code: grpc.StatusCode, coro: object) -> RpcError:
    with pytest.raises(RpcError) as err:
        await coro  # type: ignore[misc]
    assert err.value.code is code, err.value
    return err.value


async def issue(admin: MgmtdClient, user: str, **kw: object) -> pb.IssueTokenResponse:
    resp: pb.IssueTokenResponse = await admin.identity.issue_token(
        pb.IssueTokenRequest(user_name=user, **kw),  # type: ignore[arg-type]
    )
    return resp


async def test_users_groups_and_tokens(mgmtd: InProcessMgmtd, db_url: str) -> None:
    admin = mgmtd.client()
    group = await admin.identity.create_group(pb.CreateGroupRequest(name="vision"))
    assert group.group.gid >= 1000
    alice = await admin.identity.create_user(pb.CreateUserRequest(name="alice", group_names=["vision"]))
    assert alice.user.uid >= 1000 and list(alice.user.group_names) == ["vision"]
    await admin.identity.create_user(pb.CreateUserRequest(name="bob", uid=4242, role=common_pb2.ROLE_ADMIN))
    await expect(grpc.StatusCode.ALREADY_EXISTS, admin.identity.create_user(pb.CreateUserRequest(name="bob")))
    await expect(
        grpc.StatusCode.ALREADY_EXISTS,
        admin.identity.create_user(pb.CreateUserRequest(name="eve", uid=4242)),
    )

    issued = await issue(admin, "alice", description="laptop")
    as_alice = MgmtdClient([mgmtd.address], token=issued.token)
    me = (await as_alice.identity.who_am_i(pb.WhoAmIRequest())).principal
    assert (me.name, me.uid, list(me.gids), me.role) == (
        "alice",
        alice.user.uid,
        [group.group.gid],
        common_pb2.ROLE_USER,
    )

    # Only the hash is stored.
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT secret_hash FROM mgmtd_tokens")).scalars().all()
    engine.dispose()
    assert len(stored) == 1 and issued.token.split("_", 2)[2] not in stored[0]

    # Users see and issue their own tokens only; admins anyone's.
    own = await as_alice.identity.issue_token(pb.IssueTokenRequest(description="second"))
    listed = await as_alice.identity.list_tokens(pb.ListTokensRequest())
    assert sorted(t.description for t in listed.tokens) == ["laptop", "second"]
    await expect(
        grpc.StatusCode.PERMISSION_DENIED,
        as_alice.identity.list_tokens(pb.ListTokensRequest(user_name="bob")),
    )
    await expect(
        grpc.StatusCode.PERMISSION_DENIED,
        as_alice.identity.issue_token(pb.IssueTokenRequest(user_name="bob")),
    )
    await expect(grpc.StatusCode.PERMISSION_DENIED, as_alice.identity.list_users(pb.ListUsersRequest()))
    bob_token = (await issue(admin, "bob")).token
    as_bob = MgmtdClient([mgmtd.address], token=bob_token)
    users = await as_bob.identity.list_users(pb.ListUsersRequest())  # bob is an admin
    assert {u.name for u in users.users} == {"alice", "bob"}
    await expect(
        grpc.StatusCode.PERMISSION_DENIED,
        as_alice.identity.revoke_token(pb.RevokeTokenRequest(token_id=bob_token.split("_")[1])),
    )

    # Revoking takes effect at once, here (even for a token mgmtd has just cached) and for services
    # asking through ValidateToken.
    as_second = MgmtdClient([mgmtd.address], token=own.token)
    assert (await as_second.identity.who_am_i(pb.WhoAmIRequest())).principal.name == "alice"
    await as_alice.identity.revoke_token(pb.RevokeTokenRequest(token_id=own.token_info.token_id))
    await expect(grpc.StatusCode.UNAUTHENTICATED, as_second.identity.who_am_i(pb.WhoAmIRequest()))
    validator = MgmtdTokenValidator(mgmtd.client())
    assert (await validator.validate(issued.token)).name == "alice"
    with pytest.raises(Unauthenticated, match="revoked"):
        await validator.validate(own.token)

    # A disabled user's tokens stop working; enabling brings them back.
    await admin.identity.set_user_disabled(pb.SetUserDisabledRequest(name="alice", disabled=True))
    await expect(grpc.StatusCode.UNAUTHENTICATED, as_alice.identity.who_am_i(pb.WhoAmIRequest()))
    await admin.identity.set_user_disabled(pb.SetUserDisabledRequest(name="alice", disabled=False))
    assert (await as_alice.identity.who_am_i(pb.WhoAmIRequest())).principal.name == "alice"
    for c in (admin, as_alice, as_bob, as_second):
        await c.close()


async def test_expired_tokens_are_refused(mgmtd: InProcessMgmtd) -> None:
    admin = mgmtd.client()
    await admin.identity.create_user(pb.CreateUserRequest(name="dave"))
    short = await issue(admin, "dave", ttl_s=0.2)
    import asyncio

    await asyncio.sleep(0.3)  # the token's 0.2 s lifetime passes: the point of the test
    dave = MgmtdClient([mgmtd.address], token=short.token)
    err = await expect(grpc.StatusCode.UNAUTHENTICATED, dave.identity.who_am_i(pb.WhoAmIRequest()))
    assert "expired" in err.details
    await dave.close()
    await admin.close()


async def test_group_membership(mgmtd: InProcessMgmtd) -> None:
    admin = mgmtd.client()
    await admin.identity.create_group(pb.CreateGroupRequest(name="nlp", gid=5000))
    await admin.identity.create_user(pb.CreateUserRequest(name="erin"))
    added = await admin.identity.add_group_member(pb.AddGroupMemberRequest(group_name="nlp", user_name="erin"))
    assert list(added.group.member_names) == ["erin"]
    again = await admin.identity.add_group_member(pb.AddGroupMemberRequest(group_name="nlp", user_name="erin"))
    assert list(again.group.member_names) == ["erin"]
    removed = await admin.identity.remove_group_member(pb.RemoveGroupMemberRequest(group_name="nlp", user_name="erin"))
    assert list(removed.group.member_names) == []
    await expect(
        grpc.StatusCode.NOT_FOUND,
        admin.identity.add_group_member(pb.AddGroupMemberRequest(group_name="nope", user_name="erin")),
    )
    groups = await admin.identity.list_groups(pb.ListGroupsRequest())
    assert [(g.name, g.gid) for g in groups.groups] == [("nlp", 5000)]
    await admin.close()
