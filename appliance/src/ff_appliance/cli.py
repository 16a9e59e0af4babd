"""The ``fireflyer`` command line: argument parsing and the one place that reads the environment."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.message import Message

from ff_appliance import admin, alerts, join, lifecycle, mount
from ff_appliance.cli_image import add_image_command
from ff_appliance.containers import ContainersError
from ff_appliance.demo import DemoError, run_demo
from ff_appliance.demo_faults import FAULT_KINDS, ClusterHandle
from ff_appliance.demo_storage import StorageDemoError
from ff_appliance.demo_train import NUM_AGENTS_WITH_FAULTS, TrainDemoError, TrainPlan, find_example, run_train_demo
from ff_appliance.hosts import HostsError, LinkShape, parse_host_zone, parse_link_shape
from ff_appliance.images import ImageError
from ff_appliance.join import JoinError, JoinOptions
from ff_appliance.lifecycle import ApplianceError, UpOptions
from ff_appliance.services import AGENT, MGMTD, SERVICES
from ff_appliance.state import PlanError, StateDir, load_plan, read_secret
from ff_appliance.status import collect_status, render_status
from ff_appliance.supervisor import SupervisorError
from ff_cluster import MgmtdClient
from ff_rpc import RpcError

DEFAULT_STATE_DIR = ".fireflyer"
STATE_DIR_ENV = "FF_STATE_DIR"
TOKEN_ENV = "FF_TOKEN"
MGMTD_ENV = "FF_MGMTD_ADDRESSES"
# uids and gids of the identity registry: uint32 on the wire, 0 (root) never, 2^32-1 is (uid_t)-1.
MAX_ID = 2**32 - 2
EXIT_OK, EXIT_FAILED = 0, 1  # argparse exits 2 on usage errors

Handler = Callable[[argparse.Namespace, "Cli"], Coroutine[Any, Any, int]]
AdminCall = Callable[[MgmtdClient, argparse.Namespace], Awaitable[Message]]


class CliError(Exception):
    """A command cannot run as asked (no cluster here, no token, ...)."""


@dataclass(frozen=True)
class Cli:
    """What commands get from the entry point instead of reading globals."""

    environ: Mapping[str, str]
    out: TextIO
    prog: str = "fireflyer"

    def state(self, args: argparse.Namespace) -> StateDir:
        """The state folder: ``--state-dir``, else ``$FF_STATE_DIR``, else ``.fireflyer`` here; made absolute."""
        raw = args.state_dir or self.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
        return StateDir(Path(raw).expanduser().resolve())

    def print(self, text: str = "") -> None:
        """Print a line to the command's output, flushed at once (progress shows while a long command runs)."""
        print(text, file=self.out, flush=True)

    def down_hint(self, state: StateDir) -> str:
        """The command that stops this cluster as the user would type it (``--state-dir`` unless the default)."""
        default = Path(DEFAULT_STATE_DIR).resolve()
        where = "" if state.root == default else f" --state-dir {state.root}"
        return f"{self.prog} down{where}"


# ---- cluster commands ----


async def _cmd_up(args: argparse.Namespace, cli: Cli) -> int:
    state = cli.state(args)
    counts = {spec.name: getattr(args, f"num_{spec.name}") for spec in SERVICES if spec.scalable}
    options = UpOptions(
        env=dict(cli.environ),
        counts=counts,
        timeout_s=args.timeout_s,
        log_level=args.log_level,
        database_url=getattr(args, "database", None),
        hosts=args.hosts,
        link_shapes=tuple(args.link_shape or ()),
        host_zones=tuple(args.host_zone or ()),
        containers=args.containers,
        container_dirs=tuple(getattr(args, "container_dirs", ())),
        trainer_image=getattr(args, "trainer_image", None),
    )
    result = await lifecycle.up(state, options, cli.out)
    cli.print(lifecycle.render_endpoints(state, result, cli.down_hint(state)))
    if getattr(args, "mount", None):
        await _mount(args.mount, state, [i.grpc_address for i in result.plan.of_service(MGMTD)], cli)
    return EXIT_OK


async def _mount(where: str, state: StateDir, mgmtd: list[str], cli: Cli) -> None:
    token = read_secret(state.admin_token_file)
    if token is None:
        raise CliError(f"{state.root} has no admin token to mount 3FS with")
    try:
        cli.print(await asyncio.to_thread(mount.mount_3fs, state, mgmtd, token, where, cli.environ))
    except OSError as err:
        raise CliError(f"cannot mount 3FS on {where}: {err.strerror or err}") from err


async def _cmd_down(args: argparse.Namespace, cli: Cli) -> int:
    state = cli.state(args)
    await asyncio.to_thread(mount.unmount_3fs, state, cli.out)
    killed = await asyncio.to_thread(lifecycle.down, state, args.timeout_s, cli.out, env=dict(cli.environ))
    cli.print(f"cluster stopped; its data stays in {state.root} (`{cli.prog} up` brings it back)")
    if killed:
        cli.print(f"killed after {args.timeout_s:g}s without a clean stop: {', '.join(killed)}")
    return EXIT_OK


async def _cmd_status(args: argparse.Namespace, cli: Cli) -> int:
    return await _show_status(cli, cli.state(args), as_json=args.json)


async def _show_status(cli: Cli, state: StateDir, *, as_json: bool) -> int:
    plan, cluster_token = load_plan(state), read_secret(state.cluster_token_file)
    if plan is None or cluster_token is None:
        raise CliError(f"no cluster in {state.root}: run `{cli.prog} up` first")
    joined = join.read_joined(state) if join.joined_file(state).exists() else {}
    status = await collect_status(state, plan, cluster_token, joined.get("mgmtd", ()))
    cli.print(json.dumps(status.to_dict(), indent=2) if as_json else render_status(status))
    return EXIT_OK if status.healthy else EXIT_FAILED


async def _cmd_demo(args: argparse.Namespace, cli: Cli) -> int:
    state = cli.state(args)
    example = None if args.tour else find_example(args.example)  # before anything starts: a clear error
    faults: tuple[str, ...] = () if args.quick else (args.faults if args.faults is not None else FAULT_KINDS)
    if example is not None and "hang" in faults:
        # The SIGSTOP fault cordons a node: a third agent keeps 2 for the task (a cluster only grows).
        planned = len(existing.of_service(AGENT)) if (existing := load_plan(state)) is not None else 0
        args.num_agent = max(args.num_agent or 0, planned, NUM_AGENTS_WITH_FAULTS)
    args.container_dirs = (str(example),) if example is not None else ()  # the agents' ranks run it
    cli.print(f"== up ({state.root})")
    await _cmd_up(args, cli)
    cli.print("\n== status")
    if await _show_status(cli, state, as_json=False) != EXIT_OK:
        raise CliError("the cluster is not healthy; see the status above and the logs in " + str(state.logs_dir))
    plan = load_plan(state)
    token = read_secret(state.admin_token_file)
    if plan is None or token is None:
        raise CliError(f"{state.root} has no plan or admin token after up")
    mgmtd_instances = plan.of_service(MGMTD)
    addresses = [i.grpc_address for i in mgmtd_instances]
    if not args.train_only:
        cli.print("\n== a tour of the services")
        # A container cluster's agents see the state folder, not this machine's temp folder.
        scratch = state.root if plan.containers is not None else None
        await run_demo(addresses, token, mgmtd_instances[0].node_id, cli.out, scratch)
    if example is not None:
        cli.print(
            "\n== train the tiny GPT on this cluster"
            + (f" (faults: {', '.join(faults)})" if faults else " (--quick: no faults)")
        )
        cluster = ClusterHandle(state=state, env=dict(cli.environ))
        await run_train_demo(addresses, token, TrainPlan.for_demo(example, faults=faults), cli.out, cluster)
    cli.print(f"\nthe cluster keeps running; stop it with: {cli.down_hint(state)}")
    return EXIT_OK


async def _cmd_join(args: argparse.Namespace, cli: Cli) -> int:
    state = cli.state(args)
    mgmtd = tuple(a.strip() for item in args.mgmtd for a in item.split(",") if a.strip())
    token = args.token or cli.environ.get(TOKEN_ENV)
    if not token:
        raise CliError(
            f"no token: pass --token (the cluster token: <state>/secrets/cluster_token where the cluster "
            f"runs) or set {TOKEN_ENV}"
        )
    options = JoinOptions(
        mgmtd=mgmtd,
        token=token,
        agent=args.agent,
        storage_disks=tuple(args.storage or ()),
        address=args.address or "",
        env=dict(cli.environ),
        timeout_s=args.timeout_s,
    )
    plan = await join.join(state, options, cli.out)
    nodes = ", ".join(f"{i.name} node {i.node_id} at {i.grpc_address}" for i in plan.instances)
    cli.print(f"joined: {nodes}\nleave with: {cli.prog} leave --state-dir {state.root}")
    return EXIT_OK


async def _cmd_leave(args: argparse.Namespace, cli: Cli) -> int:
    state = cli.state(args)
    await join.leave(state, args.drain_timeout_s, cli.out)
    cli.print("left the cluster: this machine's nodes are drained, stopped and removed from it")
    return EXIT_OK


def _fault_kinds(text: str) -> tuple[str, ...]:
    """``--faults``: a comma-separated subset of FAULT_KINDS."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: give some of {', '.join(FAULT_KINDS)}, comma-separated")
    return kinds


# ---- identity commands ----


def _mgmtd_addresses(args: argparse.Namespace, state: StateDir, cli: Cli) -> list[str]:
    """--mgmtd, else $FF_MGMTD_ADDRESSES (as every client reads it), else the state folder's plan."""
    given = args.mgmtd or [cli.environ.get(MGMTD_ENV, "")]
    addresses = [a.strip() for item in given for a in item.split(",") if a.strip()]
    if addresses:
        return addresses
    plan = load_plan(state)
    if plan is None or not plan.of_service(MGMTD):
        raise CliError(f"no cluster in {state.root}: run `{cli.prog} up`, set {MGMTD_ENV} or pass --mgmtd HOST:PORT")
    return [i.grpc_address for i in plan.of_service(MGMTD)]


def _token(args: argparse.Namespace, state: StateDir, cli: Cli) -> str:
    token = args.token or cli.environ.get(TOKEN_ENV) or read_secret(state.admin_token_file)
    if not token:
        raise CliError(f"no token: pass --token, set {TOKEN_ENV}, or run `{cli.prog} up` (it saves an admin token)")
    return token


async def _cmd_admin(args: argparse.Namespace, cli: Cli) -> int:
    state = cli.state(args)
    addresses, token = _mgmtd_addresses(args, state, cli), _token(args, state, cli)
    args.token = token  # calls to other services (alerts) go with the same token
    async with admin.connect(addresses, token) as client:
        response = await args.call(client, args)
    if args.json:
        cli.print(json_format.MessageToJson(response, preserving_proto_field_name=True, indent=2))
    else:
        cli.print(args.render(response))
    return EXIT_OK


# ---- parsing ----


def _common_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    where = f"${STATE_DIR_ENV} or ./{DEFAULT_STATE_DIR}"
    parent.add_argument("--state-dir", default=None, help=f"the cluster's state folder (default: {where})")
    return parent


def _identity_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False, parents=[_common_parent()])
    parent.add_argument(
        "--mgmtd",
        action="append",
        metavar="HOST:PORT",
        help=f"mgmtd address(es) (default: ${MGMTD_ENV}, else the state folder's plan)",
    )
    parent.add_argument(
        "--token", default=None, help=f"bearer token (default: ${TOKEN_ENV}, else the state folder's admin token)"
    )
    parent.add_argument("--json", action="store_true", help="print the answer as JSON")
    return parent


def _add_up_arguments(p: argparse.ArgumentParser) -> None:
    for spec in SERVICES:
        if spec.scalable:
            help_text = f"number of {spec.name} instances (default: as planned; {spec.default_count} in a new cluster)"
            p.add_argument(f"--{spec.name}", dest=f"num_{spec.name}", type=_positive_int, metavar="N", help=help_text)
    p.add_argument("--timeout-s", type=float, default=60.0, help="how long to wait for everything to be up")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument(
        "--hosts",
        type=_positive_int,
        metavar="N",
        default=None,
        help="a new cluster only (needs root): storage and agent instances on N hosts, each a network namespace "
        "with its own address on a veth to a bridge (default: everything on loopback)",
    )
    p.add_argument(
        "--link-shape",
        type=_link_shape,
        action="append",
        metavar="[HOST:]rate=R,delay=D",
        help="shape the hosts' links with tc, e.g. rate=100mbit (every host) or h3:rate=10mbit,delay=20ms (one "
        "host, as a cross-zone link), h3:none (unshaped); repeatable; kept for later ups (delay needs netem)",
    )
    p.add_argument(
        "--host-zone",
        type=_host_zone,
        action="append",
        metavar="HOST=ZONE",
        help="the agents of HOST register in network zone ZONE (e.g. h3=far with a shaped h3 link: a host across "
        "zones); HOST= for the default zone; repeatable; kept, used when an agent starts",
    )
    p.add_argument(
        "--containers",
        action="store_true",
        help="a new cluster only (root, podman): each instance in its own container, from the images "
        "`fireflyer image build` makes; kept for later ups",
    )
    p.add_argument(
        "--trainer-image",
        metavar="IMAGE",
        default=None,
        help="with --containers: the agents' image (default: localhost/fireflyer/trainer:VERSION); e.g. the services "
        "image for agents that run no torch ranks; kept for later ups",
    )


def _host_zone(text: str) -> tuple[str, str]:
    try:
        return parse_host_zone(text)
    except HostsError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _link_shape(text: str) -> tuple[str | None, LinkShape | None]:
    try:
        return parse_link_shape(text)
    except HostsError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _folder(text: str) -> Path:
    return Path(text).expanduser().resolve()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _registry_id(text: str) -> int:
    """A uid or gid given on the command line: 1..2^32-2 (0 is root, and on the wire "pick one")."""
    if text.strip() == "0":
        raise argparse.ArgumentTypeError("0 is root's; leave the option out to get the next free one")
    value = _positive_int(text)
    if value > MAX_ID:
        raise argparse.ArgumentTypeError(f"{text} is above {MAX_ID}")
    return value


def _admin_command(sub: Any, name: str, help_text: str, call: AdminCall, render: Callable[[Any], str]) -> Any:
    p = sub.add_parser(name, help=help_text, description=help_text, parents=[_identity_parent()])
    p.set_defaults(handler=_cmd_admin, call=call, render=render)
    return p


async def _user_add(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.user_add(c, a.name, admin=a.admin, uid=a.uid, groups=a.group or [])


async def _user_list(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.user_list(c)


async def _user_disable(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.user_set_disabled(c, a.name, disabled=True)


async def _user_enable(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.user_set_disabled(c, a.name, disabled=False)


def _add_join_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "join",
        parents=[common],
        help="run this machine's agent and/or storage in a cluster that runs "
        "elsewhere (its state folder is this machine's own)",
    )
    p.add_argument("--mgmtd", action="append", required=True, metavar="HOST:PORT", help="the cluster's mgmtd")
    p.add_argument("--token", default=None, help=f"the cluster token (default: ${TOKEN_ENV})")
    p.add_argument("--agent", action="store_true", help="run an agent (GPUs through NVML, else CPU device slots)")
    storage_help = "run a storage service with its targets in PATH(s); it takes its share of the replicas"
    p.add_argument("--storage", nargs="+", type=_folder, metavar="PATH", help=storage_help)
    p.add_argument("--address", default=None, help="the address to listen on (default: the one that reaches mgmtd)")
    p.add_argument("--timeout-s", type=float, default=120.0, help="how long to wait (replicas syncing included)")
    p.set_defaults(handler=_cmd_join)
    p = sub.add_parser(
        "leave",
        parents=[common],
        help="drain this machine's joined nodes (tasks end, replicas move to other nodes), stop them and remove them "
        "from the cluster (mgmtd and the scheduler forget them; their ids are not reused)",
    )
    p.add_argument("--drain-timeout-s", type=float, default=300.0, help="how long tasks and replica syncs may take")
    p.set_defaults(handler=_cmd_leave)


def _add_user_commands(sub: Any) -> None:
    users = sub.add_parser("user", help="users of the cluster").add_subparsers(dest="action", required=True)
    p = _admin_command(users, "add", "create a user", _user_add, lambda r: admin.render_user(r.user))
    p.add_argument("name")
    p.add_argument("--admin", action="store_true", help="give the user the admin role")
    p.add_argument("--uid", type=_registry_id, default=0, help=f"uid, 1..{MAX_ID} (default: the next free one)")
    p.add_argument("--group", action="append", metavar="G", help="add the user to group G (repeatable)")
    _admin_command(users, "list", "list users", _user_list, lambda r: admin.render_users(r.users))
    p = _admin_command(
        users,
        "disable",
        "disable a user (their tokens stop working)",
        _user_disable,
        lambda r: admin.render_user(r.user),
    )
    p.add_argument("name")
    p = _admin_command(users, "enable", "enable a user again", _user_enable, lambda r: admin.render_user(r.user))
    p.add_argument("name")


async def _group_add(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.group_add(c, a.name, gid=a.gid)


async def _group_list(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.group_list(c)


async def _group_add_member(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.group_add_member(c, a.group, a.user)


async def _group_remove_member(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.group_remove_member(c, a.group, a.user)


def _add_group_commands(sub: Any) -> None:
    groups = sub.add_parser("group", help="groups of users").add_subparsers(dest="action", required=True)
    p = _admin_command(groups, "add", "create a group", _group_add, lambda r: admin.render_group(r.group))
    p.add_argument("name")
    p.add_argument("--gid", type=_registry_id, default=0, help=f"gid, 1..{MAX_ID} (default: the next free one)")
    _admin_command(groups, "list", "list groups", _group_list, lambda r: admin.render_groups(r.groups))
    for action, call in (("add-member", _group_add_member), ("remove-member", _group_remove_member)):
        p = _admin_command(
            groups, action, f"{action.replace('-', ' ')} of a group", call, lambda r: admin.render_group(r.group)
        )
        p.add_argument("group")
        p.add_argument("user")


async def _token_issue(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.token_issue(c, a.user, ttl_s=a.ttl_s, description=a.description)


async def _token_list(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.token_list(c, a.user)


async def _token_revoke(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.token_revoke(c, a.token_id)


async def _whoami(c: MgmtdClient, a: argparse.Namespace) -> Message:
    return await admin.whoami(c)


def _add_token_commands(sub: Any) -> None:
    tokens = sub.add_parser("token", help="bearer tokens").add_subparsers(dest="action", required=True)
    p = _admin_command(tokens, "issue", "issue a token (the secret is printed once)", _token_issue, admin.render_issued)
    p.add_argument("--user", default="", help="whose token (default: the caller)")
    p.add_argument("--ttl-s", type=float, default=0.0, help="lifetime in seconds (default: never expires)")
    p.add_argument("--description", default="", help="what the token is for")
    p = _admin_command(
        tokens, "list", "list tokens (never their secrets)", _token_list, lambda r: admin.render_tokens(r.tokens)
    )
    p.add_argument("--user", default="", help="whose tokens (default: the caller)")
    p = _admin_command(tokens, "revoke", "revoke a token", _token_revoke, lambda r: admin.render_token(r.token_info))
    p.add_argument("token_id")


async def _alerts(c: MgmtdClient, a: argparse.Namespace) -> Message:
    state = "firing" if a.firing else "resolved" if a.resolved else "any"
    return await alerts.list_alerts(c, a.token, state=state, rule=a.rule, since_s=a.since_s, limit=a.limit)


def _add_alerts_command(sub: Any) -> None:
    p = _admin_command(
        sub,
        "alerts",
        "the alert log (newest first): what fired, when, and whether it resolved",
        _alerts,
        alerts.render_alerts,
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--firing", action="store_true", help="only alerts still firing")
    which.add_argument("--resolved", action="store_true", help="only resolved alerts")
    p.add_argument("--rule", default="", help="only this rule's alerts")
    p.add_argument("--since-s", type=float, default=0.0, help="only alerts active in the last that many seconds")
    p.add_argument("--limit", type=_positive_int, default=100, help="at most this many (default 100, at most 1000)")


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand with its options; each parser's ``handler`` default is the coroutine that runs it."""
    parser = argparse.ArgumentParser(
        prog="fireflyer", description="Bring up and run a Fire-Flyer cluster on this machine."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common_parent()
    p = sub.add_parser("up", parents=[common], help="start every service; wait until healthy and registered")
    _add_up_arguments(p)
    database_help = (
        "a new cluster only: keep mgmtd's, meta's, the scheduler's and telemetry's state on this "
        "PostgreSQL database (postgresql://user:password@host:port/db; a schema each), not SQLite files"
    )
    p.add_argument("--database", metavar="URL", default=None, help=database_help)
    p.add_argument("--mount", metavar="DIR", default=None, help="also mount 3FS there with FUSE (down unmounts it)")
    p.set_defaults(handler=_cmd_up)
    p = sub.add_parser("down", parents=[common], help="stop every service (data stays)")
    p.add_argument("--timeout-s", type=float, default=20.0, help="wait this long before SIGKILL")
    p.set_defaults(handler=_cmd_down)
    p = sub.add_parser("status", parents=[common], help="services, nodes, health (exit 1 unless all healthy)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_cmd_status)
    p = sub.add_parser(
        "demo",
        parents=[common],
        help="up, status, a tour of each service's calls, then train a tiny GPT through a preemption",
    )
    _add_up_arguments(p)
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--quick", action="store_true", help="skip the faults and the reference run (the preemption stays)"
    )
    how.add_argument(
        "--faults",
        type=_fault_kinds,
        metavar="KIND[,KIND]",
        default=None,
        help=f"only these faults ({', '.join(FAULT_KINDS)}; default: all), then the reference run",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--tour", action="store_true", help="only the tour of each service's calls (no training)")
    what.add_argument("--train-only", action="store_true", help="only the training (no tour)")
    p.add_argument(
        "--example",
        metavar="DIR",
        default=None,
        help="the tiny-GPT example's folder, readable by every agent (default: this checkout's)",
    )
    p.set_defaults(handler=_cmd_demo)
    _add_join_commands(sub, common)
    _add_user_commands(sub)
    _add_group_commands(sub)
    _add_token_commands(sub)
    _add_alerts_command(sub)
    add_image_command(sub)
    _admin_command(sub, "whoami", "who the token belongs to", _whoami, lambda r: admin.render_principal(r.principal))
    return parser


def run(argv: Sequence[str], environ: Mapping[str, str], out: TextIO, err: TextIO, prog: str = "fireflyer") -> int:
    """Parse ``argv`` and run the command; the exit code (0 ok, 1 failed, 2 usage).

    ``prog`` is how the user ran us (e.g. ``.venv/bin/fireflyer``), for the hints printed.
    """
    args = build_parser().parse_args(list(argv))
    cli = Cli(environ=environ, out=out, prog=prog)
    handler: Handler = args.handler
    try:
        return asyncio.run(handler(args, cli))
    except RpcError as exc:
        print(f"fireflyer: {exc.code.name}: {exc.details}", file=err)
    except BrokenPipeError:
        raise  # the reader went away (`fireflyer user list | head -1`): main() stops quietly
    except (
        ApplianceError,
        SupervisorError,
        PlanError,
        DemoError,
        StorageDemoError,
        TrainDemoError,
        CliError,
        JoinError,
        ImageError,
        ContainersError,
        OSError,
    ) as exc:
        print(f"fireflyer: {exc}", file=err)
    except KeyboardInterrupt:
        print("fireflyer: interrupted", file=err)
        return 130
    return EXIT_FAILED


def _prog_name(argv0: str) -> str:
    """How the user ran us, for hints such as ``.venv/bin/fireflyer down``."""
    path = Path(argv0)
    on_path = shutil.which("fireflyer")
    if path.name != "fireflyer" or (on_path is not None and Path(on_path).resolve() == path.resolve()):
        return "fireflyer"
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main() -> int:
    """Console entry point: the only place that reads ``sys.argv`` and ``os.environ``."""
    code = _main()
    # The process exits next: the interpreter's teardown would garbage-collect every object the command
    # imported (grpc, protobuf), 0.2-0.4 s of each call on a loaded 2-core machine; frozen ones are skipped.
    gc.freeze()
    return code


def _main() -> int:
    try:
        return run(sys.argv[1:], os.environ, sys.stdout, sys.stderr, prog=_prog_name(sys.argv[0]))
    except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
        return int(exc.code or 0)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush does not fail again
        os.close(devnull)
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe ended
