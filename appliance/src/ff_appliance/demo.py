"""``fireflyer demo``: exercise mgmtd end to end on the running cluster, printing each step."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import grpc

from ff_appliance import admin
from ff_appliance.demo_agent import NUM_STEPS as NUM_AGENT_STEPS
from ff_appliance.demo_agent import agent_section
from ff_appliance.demo_hf3fs_tools import NUM_TOOLS_STEPS, tools_section
from ff_appliance.demo_meta import NUM_META_STEPS, meta_section
from ff_appliance.demo_scheduler import NUM_STEPS as NUM_SCHEDULER_STEPS
from ff_appliance.demo_scheduler import scheduler_section
from ff_appliance.demo_storage import storage_section
from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb

DEMO_GROUP = "demo"
DEMO_USER = "demo-user"
CONFIG_NODE_TYPE = common_pb2.NODE_TYPE_STORAGE
NUM_STEPS = 11 + NUM_META_STEPS + NUM_TOOLS_STEPS + NUM_SCHEDULER_STEPS + NUM_AGENT_STEPS
REVOKE_WAIT_S = 5.0  # services may cache a token check for a moment


class DemoError(Exception):
    """The cluster did not behave as the demo expects."""


async def expect_refused(call: Awaitable[Any], code: grpc.StatusCode) -> RpcError:
    """Await ``call``, which must fail with ``code``; the error.

    Raises:
        DemoError: the call succeeded, or failed with another code.
    """
    try:
        await call
    except RpcError as err:
        if err.code is not code:
            raise DemoError(f"expected {code.name}, got {err.code.name}: {err.details}") from None
        return err
    raise DemoError(f"expected {code.name}, but the call succeeded")


@dataclass
class Demo:
    """The demo's steps, each printed as ``[n/9] what`` followed by what the cluster answered."""

    addresses: Sequence[str]
    out: TextIO
    _step: int = 0

    def step(self, title: str) -> None:
        """Print the next numbered step title (``[n/N] title``)."""
        self._step += 1
        print(f"\n[{self._step}/{NUM_STEPS}] {title}", file=self.out)

    def say(self, text: str) -> None:
        """Print what the cluster answered, indented under the current step."""
        for line in text.splitlines():
            print(f"    {line}", file=self.out)

    async def group_and_user(self, adm: MgmtdClient) -> None:
        """Create the demo group and a user in it; both are reused (the user enabled again) from an earlier demo."""
        self.step(f"create group {DEMO_GROUP!r} and user {DEMO_USER!r} in it")
        try:
            self.say(admin.render_group((await admin.group_add(adm, DEMO_GROUP)).group))
        except RpcError as err:
            if err.code is not grpc.StatusCode.ALREADY_EXISTS:
                raise
            self.say(f"group {DEMO_GROUP} exists already: reused")
        try:
            user = (await admin.user_add(adm, DEMO_USER, groups=[DEMO_GROUP])).user
        except RpcError as err:
            if err.code is not grpc.StatusCode.ALREADY_EXISTS:
                raise
            self.say(f"user {DEMO_USER} exists already: reused (enabled, in {DEMO_GROUP})")
            await admin.group_add_member(adm, DEMO_GROUP, DEMO_USER)
            user = (await admin.user_set_disabled(adm, DEMO_USER, disabled=False)).user
        self.say(admin.render_user(user))

    async def issue(self, adm: MgmtdClient) -> pb.IssueTokenResponse:
        """Issue the demo user a one-hour token as admin; the response holds its secret."""
        self.step(f"issue {DEMO_USER} a token (as admin)")
        issued = await admin.token_issue(adm, DEMO_USER, ttl_s=3600, description="fireflyer demo")
        self.say(f"token {issued.token_info.token_id}, expires in 1 h; secret {issued.token[:8]}... (shown once)")
        return issued

    async def whoami(self, token: str) -> None:
        """Check that mgmtd resolves ``token`` to the demo user in the demo group.

        Raises:
            DemoError: whoami answered another user, or without the demo group.
        """
        self.step(f"whoami with {DEMO_USER}'s token")
        async with admin.connect(self.addresses, token) as client:
            principal = (await admin.whoami(client)).principal
        self.say(admin.render_principal(principal))
        if principal.name != DEMO_USER or DEMO_GROUP not in principal.group_names:
            raise DemoError(f"whoami answered {principal.name} in {list(principal.group_names)}")

    async def refused_admin_call(self, token: str) -> None:
        """Check that the demo user's ``token`` gets PERMISSION_DENIED on an admin-only call.

        Raises:
            DemoError: the call was not refused with PERMISSION_DENIED.
        """
        self.step(f"{DEMO_USER} tries an admin call (ListUsers)")
        async with admin.connect(self.addresses, token) as client:
            err = await expect_refused(admin.user_list(client), grpc.StatusCode.PERMISSION_DENIED)
        self.say(f"refused: {err.code.name}: {err.details}")

    async def versioned_config(self, adm: MgmtdClient) -> None:
        """Set a node type's config, read it back, and check that a write against the stale version is ABORTED.

        Raises:
            DemoError: the config read back differs, or the stale write was not refused with ABORTED.
        """
        kind = common_pb2.NodeType.Name(CONFIG_NODE_TYPE)
        self.step(f"set and read back the versioned config of {kind}")
        current = await adm.mgmtd.get_config(pb.GetConfigRequest(node_type=CONFIG_NODE_TYPE))
        content = f'# set by fireflyer demo\nnote = "demo at {time.strftime("%H:%M:%S")}"\n'
        request = pb.SetConfigRequest(node_type=CONFIG_NODE_TYPE, expected_version=current.version, content=content)
        saved = await adm.mgmtd.set_config(request)
        back = await adm.mgmtd.get_config(pb.GetConfigRequest(node_type=CONFIG_NODE_TYPE))
        self.say(f"version {current.version} -> {saved.version}; read back version {back.version}:")
        self.say("".join(f"  {line}\n" for line in back.content.splitlines()))
        if back.version != saved.version or back.content != content:
            raise DemoError("the config read back is not the one just set")
        stale = pb.SetConfigRequest(node_type=CONFIG_NODE_TYPE, expected_version=current.version, content=content)
        err = await expect_refused(adm.mgmtd.set_config(stale), grpc.StatusCode.ABORTED)
        self.say(f"a write against stale version {current.version} is refused: {err.code.name}: {err.details}")

    async def toggle_node(self, adm: MgmtdClient, node_id: int) -> None:
        """Disable then re-enable ``node_id``; each change must move the routing version forward.

        Raises:
            DemoError: the routing version did not increase at each change.
        """
        self.step(f"disable, then re-enable node {node_id}")
        info = await adm.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())
        versions = [info.routing_info.version]
        for enabled in (False, True):
            resp = await adm.mgmtd.set_node_enabled(pb.SetNodeEnabledRequest(node_id=node_id, enabled=enabled))
            versions.append(resp.routing_version)
            self.say(f"node {node_id} enabled={resp.node.enabled}: routing version {resp.routing_version}")
        if not versions[0] < versions[1] < versions[2]:
            raise DemoError(f"the routing version did not move forward: {versions}")
        self.say("routing version " + " -> ".join(str(v) for v in versions))

    async def list_tokens(self, adm: MgmtdClient) -> None:
        """Print the demo user's tokens as the admin sees them (no secrets)."""
        self.step(f"list {DEMO_USER}'s tokens (secrets are never shown again)")
        self.say(admin.render_tokens((await admin.token_list(adm, DEMO_USER)).tokens))

    async def revoke(self, adm: MgmtdClient, issued: pb.IssueTokenResponse) -> None:
        """Revoke the issued token, then wait until whoami with it is UNAUTHENTICATED (services cache checks briefly).

        Raises:
            DemoError: the revoked token still works after ``REVOKE_WAIT_S``.
        """
        token_id = issued.token_info.token_id
        self.step(f"revoke token {token_id}; it stops working")
        self.say(admin.render_token((await admin.token_revoke(adm, token_id)).token_info))
        started = time.monotonic()
        async with admin.connect(self.addresses, issued.token) as client:
            while True:
                try:
                    await admin.whoami(client)
                except RpcError as err:
                    if err.code is not grpc.StatusCode.UNAUTHENTICATED:
                        raise
                    self.say(
                        f"whoami with it is refused after {time.monotonic() - started:.1f}s: "
                        f"{err.code.name}: {err.details}"
                    )
                    return
                if time.monotonic() - started > REVOKE_WAIT_S:
                    raise DemoError(f"the revoked token still works after {REVOKE_WAIT_S:g}s")
                await asyncio.sleep(0.2)


async def run_demo(
    addresses: Sequence[str], admin_token: str, node_id: int, out: TextIO, scratch_dir: Path | None = None
) -> None:
    """Every step against the cluster at ``addresses``, as the admin whose token is given.

    ``scratch_dir``: where the agents' tasks' scripts are written (they must see it; None: the system's temp folder).

    Raises:
        DemoError: the cluster answered something the demo did not expect.
        RpcError: a call failed that should not have.
    """
    demo = Demo(addresses, out)
    async with admin.connect(addresses, admin_token) as adm:
        await demo.group_and_user(adm)
        issued = await demo.issue(adm)
        await demo.whoami(issued.token)
        await demo.refused_admin_call(issued.token)
        await demo.versioned_config(adm)
        await demo.toggle_node(adm, node_id)
        await demo.list_tokens(adm)
        await demo.revoke(adm, issued)
    await storage_section(addresses, admin_token, demo.step, demo.say)
    await meta_section(addresses, admin_token, demo.step, demo.say)
    await tools_section(addresses, admin_token, demo.step, demo.say)
    await scheduler_section(addresses, admin_token, demo.step, demo.say)
    await agent_section(addresses, admin_token, demo.step, demo.say, scratch_dir)
    demo.step("done")
    demo.say(
        "mgmtd, the storage services, meta, the scheduler and the agents did all of the above on the running cluster"
    )
