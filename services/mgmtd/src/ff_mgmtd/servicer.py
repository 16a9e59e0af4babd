"""Thin gRPC adapters: protobuf in, domain calls, protobuf out. Errors map in ff_mgmtd.errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ff_mgmtd import wire
from ff_mgmtd.app import Mgmtd
from ff_mgmtd.core import tokens, validation
from ff_mgmtd.core.errors import Forbidden, InvalidRequest, InvalidToken
from ff_mgmtd.core.model import Role
from ff_mgmtd.store import identity, routing
from ff_rpc import CachingTokenValidator, Principal, TokenCheck, Unauthenticated, current_principal
from ff_rpc.auth import CLUSTER_PRINCIPAL_NAME
from ff_rpc.auth import Role as PrincipalRole
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.mgmtd.v1 import mgmtd_pb2_grpc

# What grpc.aio hands each RPC; the request and response types are the RPC's own, hence Any here.
Context = grpc.aio.ServicerContext[Any, Any]


def _require_id(field: str, value: int) -> int:
    if value <= 0:
        raise InvalidRequest(f"{field} is required")
    return value


class MgmtdServicer(mgmtd_pb2_grpc.MgmtdServiceServicer):
    """MgmtdService over one ``Mgmtd`` instance; a standby answers NotPrimary for what only the primary does."""

    def __init__(self, mgmtd: Mgmtd, stopping: asyncio.Event) -> None:
        self._m = mgmtd
        self._stopping = stopping

    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: Context) -> pb.RegisterNodeResponse:
        validation.check_count("endpoints", len(request.endpoints), validation.MAX_ENDPOINTS)
        validation.check_count("tags", len(request.tags), validation.MAX_TAGS)
        reg = validation.check_registration(
            request.node_id,
            request.node_type,
            request.hostname,
            wire.endpoints_from_proto(list(request.endpoints)),
            dict(request.tags),
        )
        node = await self._m.register_node(reg)
        t = self._m.timing
        return pb.RegisterNodeResponse(
            node_id=node.node_id,
            cluster_id=self._m.cluster_id,
            lease_duration_s=t.lease_duration_s,
            heartbeat_interval_s=t.heartbeat_interval_s,
            routing_version=self._m.routing_version,
        )

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Context) -> pb.HeartbeatResponse:
        validation.check_count("targets", len(request.targets), validation.MAX_TARGET_REPORTS)
        reports = validation.check_target_reports([(r.target_id, r.local_state) for r in request.targets])
        answer = await self._m.heartbeat(_require_id("node_id", request.node_id), reports, leaving=request.leaving)
        return pb.HeartbeatResponse(
            lease_duration_s=self._m.timing.lease_duration_s,
            routing_version=answer.routing_version,
            config_version=answer.config_version,
            enabled=answer.enabled,
        )

    async def GetRoutingInfo(self, request: pb.GetRoutingInfoRequest, context: Context) -> pb.GetRoutingInfoResponse:
        self._m.require_primary()
        if request.known_version and request.known_version == self._m.routing_version:
            return pb.GetRoutingInfoResponse(unchanged=True)
        info = await self._m.routing_info()
        return pb.GetRoutingInfoResponse(routing_info=self._routing_proto(info))

    async def WatchRoutingInfo(
        self, request: pb.WatchRoutingInfoRequest, context: Context
    ) -> AsyncIterator[pb.WatchRoutingInfoResponse]:
        async for info in self._m.watch(request.known_version, self._stopping):
            yield pb.WatchRoutingInfoResponse(routing_info=self._routing_proto(info))

    def _routing_proto(self, info: Any) -> pb.RoutingInfo:
        beats = {n.node_id: self._m.last_heartbeat_wall(n.node_id) for n in info.nodes}
        return wire.routing_to_proto(info, beats)

    async def GetPrimary(self, request: pb.GetPrimaryRequest, context: Context) -> pb.GetPrimaryResponse:
        primary_id, address = await self._m.lookup_primary()
        return pb.GetPrimaryResponse(
            primary_address=address,
            primary_instance_id=primary_id,
            instance_id=self._m.instance_id,
            is_primary=self._m.is_primary,
            epoch=self._m.epoch,
        )

    async def GetClusterInfo(self, request: pb.GetClusterInfoRequest, context: Context) -> pb.GetClusterInfoResponse:
        instances = await self._m.instances()
        return pb.GetClusterInfoResponse(
            cluster_id=self._m.cluster_id,
            instances=[wire.instance_to_proto(i) for i in instances],
            routing_version=self._m.routing_version,
            lease_duration_s=self._m.timing.lease_duration_s,
        )

    async def SetChains(self, request: pb.SetChainsRequest, context: Context) -> pb.SetChainsResponse:
        validation.check_count("chains", len(request.chains), validation.MAX_CHAINS_PER_CALL)
        for chain in request.chains:
            validation.check_count(
                f"chain {chain.chain_id}: targets", len(chain.targets), validation.MAX_TARGETS_PER_CHAIN
            )
        chains = [wire.chain_from_proto(c) for c in request.chains]
        validation.check_chains(chains)
        saved, version = await self._m.write(lambda s, f: routing.set_chains(s, f, chains))
        await self._m.publish(version)
        return pb.SetChainsResponse(chains=[wire.chain_to_proto(c) for c in saved], routing_version=version)

    async def SetChainTable(self, request: pb.SetChainTableRequest, context: Context) -> pb.SetChainTableResponse:
        if not request.HasField("chain_table"):
            raise InvalidRequest("chain_table is required")
        validation.check_count("chain_ids", len(request.chain_table.chain_ids), validation.MAX_TABLE_CHAINS)
        table = wire.chain_table_from_proto(request.chain_table)
        validation.check_chain_table(table)
        saved, version = await self._m.write(lambda s, f: routing.set_chain_table(s, f, table))
        await self._m.publish(version)
        return pb.SetChainTableResponse(chain_table=wire.chain_table_to_proto(saved), routing_version=version)

    async def OfflineTarget(self, request: pb.OfflineTargetRequest, context: Context) -> pb.OfflineTargetResponse:
        target_id = validation.check_target_id("target_id", _require_id("target_id", request.target_id))
        chain, version = await self._m.offline_target(target_id)
        return pb.OfflineTargetResponse(chain=wire.chain_to_proto(chain), routing_version=version)

    async def SetNodeEnabled(self, request: pb.SetNodeEnabledRequest, context: Context) -> pb.SetNodeEnabledResponse:
        node_id = _require_id("node_id", request.node_id)
        node, version = await self._m.write(lambda s, f: routing.set_node_enabled(s, f, node_id, request.enabled))
        await self._m.note_node(node, version)
        return pb.SetNodeEnabledResponse(node=wire.node_to_proto(node), routing_version=version)

    async def RemoveNode(self, request: pb.RemoveNodeRequest, context: Context) -> pb.RemoveNodeResponse:
        removal = await self._m.remove_node(_require_id("node_id", request.node_id))
        return pb.RemoveNodeResponse(routing_version=removal.routing_version, removed_at=removal.removed_at)

    async def GetConfig(self, request: pb.GetConfigRequest, context: Context) -> pb.GetConfigResponse:
        node_type = validation.check_node_type(request.node_type)
        entry = await self._m.read(lambda s: routing.get_config(s, node_type))
        return pb.GetConfigResponse(node_type=request.node_type, version=entry.version, content=entry.content)

    async def SetConfig(self, request: pb.SetConfigRequest, context: Context) -> pb.SetConfigResponse:
        node_type = validation.check_node_type(request.node_type)
        content = validation.check_config(request.content)
        version = await self._m.write(
            lambda s, f: routing.set_config(s, f, node_type, request.expected_version, content, time.time())
        )
        self._m.note_config_version(node_type, version)
        return pb.SetConfigResponse(version=version)


class IdentityServicer(mgmtd_pb2_grpc.IdentityServiceServicer):
    """IdentityService (users, groups, tokens) over one ``Mgmtd`` instance; changes go through the primary."""

    def __init__(self, mgmtd: Mgmtd, token_cache_ttl_s: float, local_cache: CachingTokenValidator) -> None:
        self._m = mgmtd
        self._ttl_s = token_cache_ttl_s
        # This instance's own cache: dropped on revoke/disable so mgmtd itself refuses at once.
        self._local_cache = local_cache

    async def CreateUser(self, request: pb.CreateUserRequest, context: Context) -> pb.CreateUserResponse:
        name = validation.check_new_user_name(request.name, {CLUSTER_PRINCIPAL_NAME})
        role = Role(request.role or common_pb2.ROLE_USER) if request.role in (0, 1, 2) else None
        if role is None:
            raise InvalidRequest(f"role {request.role} is not a known role")
        validation.check_count("group_names", len(request.group_names), validation.MAX_GROUPS_PER_USER)
        groups = validation.check_names("group", list(request.group_names))
        validation.check_posix_id("uid", request.uid)
        user = await self._m.write(
            lambda s, f: identity.create_user(s, f, name, request.uid, role, groups, time.time())
        )
        return pb.CreateUserResponse(user=wire.user_to_proto(user))

    async def ListUsers(self, request: pb.ListUsersRequest, context: Context) -> pb.ListUsersResponse:
        users = await self._m.read(identity.list_users)
        return pb.ListUsersResponse(users=[wire.user_to_proto(u) for u in users])

    async def SetUserDisabled(self, request: pb.SetUserDisabledRequest, context: Context) -> pb.SetUserDisabledResponse:
        name = validation.check_name("user", request.name)
        user = await self._m.write(lambda s, f: identity.set_user_disabled(s, f, name, request.disabled))
        self._local_cache.invalidate()
        return pb.SetUserDisabledResponse(user=wire.user_to_proto(user))

    async def CreateGroup(self, request: pb.CreateGroupRequest, context: Context) -> pb.CreateGroupResponse:
        name = validation.check_name("group", request.name)
        validation.check_posix_id("gid", request.gid)
        group = await self._m.write(lambda s, f: identity.create_group(s, f, name, request.gid))
        return pb.CreateGroupResponse(group=wire.group_to_proto(group))

    async def ListGroups(self, request: pb.ListGroupsRequest, context: Context) -> pb.ListGroupsResponse:
        groups = await self._m.read(identity.list_groups)
        return pb.ListGroupsResponse(groups=[wire.group_to_proto(g) for g in groups])

    async def AddGroupMember(self, request: pb.AddGroupMemberRequest, context: Context) -> pb.AddGroupMemberResponse:
        group = await self._membership(request.group_name, request.user_name, member=True)
        return pb.AddGroupMemberResponse(group=wire.group_to_proto(group))

    async def RemoveGroupMember(
        self, request: pb.RemoveGroupMemberRequest, context: Context
    ) -> pb.RemoveGroupMemberResponse:
        group = await self._membership(request.group_name, request.user_name, member=False)
        return pb.RemoveGroupMemberResponse(group=wire.group_to_proto(group))

    async def _membership(self, group_name: str, user_name: str, *, member: bool) -> Any:
        group_name = validation.check_name("group", group_name)
        user_name = validation.check_name("user", user_name)
        return await self._m.write(lambda s, f: identity.set_membership(s, f, group_name, user_name, member))

    async def IssueToken(self, request: pb.IssueTokenRequest, context: Context) -> pb.IssueTokenResponse:
        user_name = _own_or_admin(request.user_name)
        ttl_s = validation.check_ttl(request.ttl_s)
        description = validation.check_description(request.description)
        new = tokens.new_token()
        info = await self._m.write(
            lambda s, f: identity.issue_token(s, f, user_name, new, description, ttl_s, time.time())
        )
        return pb.IssueTokenResponse(token_info=wire.token_to_proto(info), token=new.token)

    async def ListTokens(self, request: pb.ListTokensRequest, context: Context) -> pb.ListTokensResponse:
        user_name = _own_or_admin(request.user_name)
        infos = await self._m.read(lambda s: identity.list_tokens(s, user_name))
        return pb.ListTokensResponse(tokens=[wire.token_to_proto(i) for i in infos])

    async def RevokeToken(self, request: pb.RevokeTokenRequest, context: Context) -> pb.RevokeTokenResponse:
        if len(request.token_id) > validation.MAX_TOKEN_ID_CHARS:
            raise InvalidRequest(f"token_id: at most {validation.MAX_TOKEN_ID_CHARS} characters")
        if not request.token_id:
            raise InvalidRequest("token_id is required")
        caller = current_principal()
        info = await self._m.read(lambda s: identity.get_token(s, request.token_id))
        if not caller.is_admin and info.user_name != caller.name:
            raise Forbidden(f"token {request.token_id} belongs to another user")
        info = await self._m.write(lambda s, f: identity.revoke_token(s, f, request.token_id, time.time()))
        self._local_cache.invalidate()
        return pb.RevokeTokenResponse(token_info=wire.token_to_proto(info))

    async def ValidateToken(self, request: pb.ValidateTokenRequest, context: Context) -> pb.ValidateTokenResponse:
        answer = await check_token(self._m, request.token, self._ttl_s)
        return pb.ValidateTokenResponse(principal=answer.principal.to_proto(), cache_ttl_s=answer.valid_for_s)

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: Context) -> pb.WhoAmIResponse:
        return pb.WhoAmIResponse(principal=current_principal().to_proto())


def _own_or_admin(user_name: str) -> str:
    """Users act on their own tokens; admins (and the cluster) on anyone's. Empty means the caller."""
    caller = current_principal()
    name = user_name or caller.name
    if caller.is_cluster and not user_name:
        raise InvalidRequest("user_name is required for the cluster principal")
    validation.check_name("user", name)
    if name != caller.name and not caller.is_admin:
        raise Forbidden(f"user {caller.name!r} may not act on tokens of {name!r}")
    return name


async def check_token(mgmtd: Mgmtd, token: str, ttl_s: float) -> TokenCheck:
    """The registry's answer for a bearer token, cacheable for ``ttl_s`` but never past the token's expiry.

    Any instance reads it from the database, standbys too.

    Raises:
        Unauthenticated: the token is unknown, malformed, expired or revoked, or its user is disabled.
    """
    now = time.time()
    try:
        user, expires_at = await mgmtd.store.arun(lambda s: identity.authenticate(s, token, now), read_only=True)
    except InvalidToken as exc:
        raise Unauthenticated(str(exc)) from None
    principal = Principal(
        uid=user.uid,
        name=user.name,
        role=PrincipalRole(int(user.role)),
        gids=user.gids,
        group_names=user.group_names,
    )
    return TokenCheck(principal, min(ttl_s, expires_at - now) if expires_at else ttl_s)


class LocalTokenChecker:
    """mgmtd checks tokens against its own database (other services ask mgmtd over gRPC)."""

    def __init__(self, mgmtd: Mgmtd, ttl_s: float) -> None:
        self._m = mgmtd
        self._ttl_s = ttl_s

    async def check(self, token: str) -> TokenCheck:
        return await check_token(self._m, token, self._ttl_s)
