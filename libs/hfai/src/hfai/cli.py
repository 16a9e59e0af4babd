"""``hfai``: submit and manage tasks on the fireflyer scheduler, or run a script locally.

hfai init <token> --mgmtd host:port [--server host:port]     (the token is checked before it is saved)
hfai python train.py [script args] -- --nodes 2 --priority 30 --group G --name N   (submit)
hfai python train.py [script args]                                                (run here)
hfai python train.py [script args] ++ --suspend-after 5                           (run here, suspend once)
hfai bash run.sh ... (the same)
hfai list | status ID | logs ID [-f] [--rank N] | stop ID | suspend ID | priority ID LEVEL | nodes | whoami
hfai admin quota set USER LEVEL NODES [--group G] | quota list [USER] | node enable|disable ID [--reason R]
hfai admin user add NAME [--admin] | user list | token issue USER | token list USER | token revoke ID
hfai validate [NODE_ID ...] [--checks cpu_stress,gemm,...]   (admins: run the node validator)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import grpc

from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from hfai import config
from hfai.api import SchedulerApi
from hfai.local import LocalOptions, run_local
from hfai.spec import task_spec

PRIORITY_NAMES = {
    50: "EXTREME_HIGH",
    40: "VERY_HIGH",
    30: "HIGH",
    20: "ABOVE_NORMAL",
    10: "NORMAL",
    8: "UNDER_NORMAL",
    5: "BELOW_NORMAL",
    0: "LOW",
    -1: "AUTO",
}


class CliError(Exception):
    """A usage or configuration problem; printed as ``hfai: <message>``, exit 2."""


def parse_priority(text: str) -> int | None:
    """A priority as typed: a level (``30``), a name (``high``, any case) or ``AUTO`` (None).

    Raises:
        CliError: none of these.
    """
    name = text.strip().upper()
    if name == "AUTO":
        return None
    for level, level_name in PRIORITY_NAMES.items():
        if name == level_name and level >= 0:
            return level
    try:
        return int(name)
    except ValueError:
        raise CliError(f"unknown priority {text!r}") from None


def split_submit(args: list[str]) -> tuple[list[str], list[str] | None, list[str] | None]:
    """``script args -- hfai options`` / ``script args ++ local options``: (script part, cluster, local)."""
    for marker in ("--", "++"):
        if marker in args:
            i = args.index(marker)
            rest = args[i + 1 :]
            return args[:i], (rest if marker == "--" else None), (rest if marker == "++" else None)
    return args, None, None


def _submit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hfai python SCRIPT ... --", description="submit to the cluster")
    p.add_argument("-n", "--nodes", type=int, default=1)
    p.add_argument("-p", "--priority", default=None)
    p.add_argument("-g", "--group", default="")
    p.add_argument("--name", default="")
    p.add_argument("-i", "--image", default="")
    p.add_argument("-e", "--env", action="append", default=[], help="K=V")
    p.add_argument("--watchdog-time", type=float, default=0.0)
    p.add_argument("--suspend-grace", type=float, default=0.0)
    p.add_argument("--max-restarts", type=int, default=None)
    return p


def _local_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hfai python SCRIPT ... ++", description="run here, as a task would run")
    p.add_argument("-ss", "--suspend-after", type=float, default=None, help="simulate a suspend after N seconds")
    p.add_argument("-ls", "--whole-life-state", type=int, default=0, help="start with this whole_life_state")
    p.add_argument("--grace", type=float, default=60.0)
    return p


def _submit_help(kind: str) -> str:
    """What ``hfai python --help`` prints: the three forms and the options after ``--`` and ``++``."""
    return "\n\n".join(
        [
            f"usage: hfai {kind} SCRIPT [args] -- [options]   submit to the cluster\n"
            f"       hfai {kind} SCRIPT [args]                 run here\n"
            f"       hfai {kind} SCRIPT [args] ++ [options]   run here, as a task would run",
            _submit_parser().format_help().strip(),
            _local_parser().format_help().strip(),
        ]
    )


def _state_name(value: int) -> str:
    name = str(pb.TaskState.Name(value))  # type: ignore[arg-type]
    return name.removeprefix("TASK_STATE_").lower()


def _render_task(t: pb.Task) -> str:
    run = t.current_run
    where = ",".join(str(n.node_id) for n in run.nodes) if t.state == pb.TASK_STATE_RUNNING else "-"
    reason = str(pb.QueueReason.Name(t.queue_reason)).removeprefix("QUEUE_REASON_").lower()
    extra = f" ({reason})" if t.state in (pb.TASK_STATE_QUEUED, pb.TASK_STATE_SUSPENDED) and t.queue_reason else ""
    end = f" - {t.end_message}" if t.end_message and t.state >= pb.TASK_STATE_SUCCEEDED else ""
    return (
        f"{t.task_id:>6}  {t.spec.name[:24]:<24} {t.user_name:<10} {_state_name(t.state) + extra:<28} "
        f"{PRIORITY_NAMES.get(t.priority, str(t.priority)):<12} nodes={t.spec.num_nodes} runs={t.num_runs} "
        f"on={where}{end}"
    )


def render_node(n: pb.Node) -> str:
    """One line of ``hfai nodes``: id, host, group, zone, state (with why) and the tasks on it."""
    state = str(pb.NodeState.Name(n.state)).removeprefix("NODE_STATE_").lower()
    why = f" ({n.state_reason})" if n.state_reason else ""
    tasks = ",".join(str(t) for t in n.task_ids) or "-"
    return (
        f"{n.node_id:>5}  {n.hostname:<16} group={n.node_group:<10} zone={n.zone or '-':<6} {state}{why} tasks={tasks}"
    )


def _render_quota(q: pb.Quota) -> str:
    return (
        f"{q.user_name:<12} {PRIORITY_NAMES.get(q.priority, str(q.priority)):<12} group={q.node_group:<10} "
        f"used {q.used_nodes}/{q.max_nodes} nodes"
    )


class _Cli:
    """The hfai commands, one method each; each prints to ``out`` and returns the exit code."""

    def __init__(self, environ: Mapping[str, str], out: TextIO, err: TextIO) -> None:
        self.environ, self.out, self.err = environ, out, err

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def api(self) -> SchedulerApi:
        return SchedulerApi.from_config(config.load(self.environ))

    def mgmtd(self) -> MgmtdClient:
        cfg = config.load(self.environ).require()
        if not cfg.mgmtd:
            raise CliError(f"no mgmtd address: pass --mgmtd to `hfai init` or set {config.FF_MGMTD_ENV}")
        return MgmtdClient(cfg.mgmtd_addresses(), token=cfg.token)

    # ---- commands ----

    async def submit_or_run(self, kind: str, args: list[str]) -> int:
        script, cluster, local = split_submit(args)
        if script[:1] in (["-h"], ["--help"]):
            self.print(_submit_help(kind))
            return 0
        if not script:
            raise CliError(f"usage: hfai {kind} SCRIPT [args] [-- options | ++ local options]")
        argv = [sys.executable if kind == "python" else "bash", *script]
        if cluster is None:
            opts = _local_parser().parse_args(local or [])
            local_options = LocalOptions(
                suspend_after_s=opts.suspend_after, whole_life_state=opts.whole_life_state, grace_s=opts.grace
            )
            return await asyncio.to_thread(run_local, argv, local_options, self.out)
        o = _submit_parser().parse_args(cluster)
        env = dict(kv.split("=", 1) for kv in o.env if "=" in kv)
        level = parse_priority(o.priority) if o.priority is not None else None
        spec = task_spec(
            [kind, *script],
            nodes=o.nodes,
            priority=level,
            group=o.group,
            name=o.name,
            env=env,
            image=o.image,
            watchdog_time_s=o.watchdog_time,
            suspend_grace_s=o.suspend_grace,
            max_restarts=o.max_restarts,
            auto_priority=o.priority is not None and level is None,
        )
        async with self.api() as api:
            task = await api.submit(spec, request_id=os.urandom(8).hex())
        self.print(f"submitted task {task.task_id}")
        self.print(_render_task(task))
        return 0

    async def list(self, a: argparse.Namespace) -> int:
        async with self.api() as api:
            tasks = await api.list(all_users=a.all)
        for t in tasks:
            self.print(_render_task(t))
        if not tasks:
            self.print("no tasks")
        return 0

    async def status(self, a: argparse.Namespace) -> int:
        async with self.api() as api:
            t = await api.get(a.task_id, include_runs=True)
        self.print(_render_task(t))
        for r in t.runs:
            state = str(pb.RunState.Name(r.state)).removeprefix("RUN_STATE_").lower()
            self.print(
                f"    run {r.run_index} (id {r.run_id}): {state} on nodes "
                f"{[n.node_id for n in r.nodes]} whole_life_state={r.start_whole_life_state}"
                f"{' - ' + r.end_message if r.end_message else ''}"
            )
        return 0

    async def logs(self, a: argparse.Namespace) -> int:
        async with self.api() as api:
            async for data in api.logs(a.task_id, node_rank=a.rank, follow=a.follow):
                self.out.write(data.decode(errors="replace"))
                self.out.flush()
        return 0

    async def act(self, a: argparse.Namespace) -> int:
        async with self.api() as api:
            if a.cmd == "priority":
                t = await api.set_priority(a.task_id, parse_priority(a.level))
            else:
                t = await (api.stop(a.task_id) if a.cmd == "stop" else api.suspend(a.task_id))
        self.print(_render_task(t))
        return 0

    async def nodes(self, a: argparse.Namespace) -> int:
        async with self.api() as api:
            for n in await api.nodes(a.group):
                self.print(render_node(n))
        return 0

    async def validate(self, a: argparse.Namespace) -> int:
        checks = [c.strip() for c in a.checks.split(",") if c.strip()]
        async with self.api() as api:
            ordered = await api.validate(a.node_ids, checks)
        self.print(
            f"validating nodes {ordered or '(none idle)'}; results in `hfai nodes` (failing nodes go to err_nodes)"
        )
        return 0

    async def whoami(self, a: argparse.Namespace) -> int:
        async with self.api() as api:
            me = await api.whoami()
        role = "admin" if me.principal.role == common_pb2.ROLE_ADMIN else "user"
        self.print(
            f"{me.principal.name} (uid {me.principal.uid}, {role}); groups: "
            f"{', '.join(me.principal.group_names) or '-'}"
        )
        self.print(f"tasks: {me.num_running_tasks} running, {me.num_queued_tasks} queued")
        for q in me.quotas:
            self.print("  quota " + _render_quota(q))
        if not me.quotas:
            self.print("  no quota: ask an admin (`hfai admin quota set`)")
        return 0

    async def admin(self, a: argparse.Namespace) -> int:
        if a.what in ("quota", "node"):
            async with self.api() as api:
                if a.what == "quota" and a.action == "set":
                    level = parse_priority(a.level)
                    if level is None:
                        raise CliError("a quota is for one priority level, not AUTO")
                    self.print(_render_quota(await api.set_quota(a.user, level, a.group, a.nodes)))
                elif a.what == "quota":
                    for q in await api.quotas(a.user or ""):
                        self.print(_render_quota(q))
                else:
                    self.print(render_node(await api.set_node_enabled(a.node_id, a.action == "enable", a.reason)))
            return 0
        client = self.mgmtd()
        try:
            await self._identity(client, a)
        finally:
            await client.close()
        return 0

    async def _identity(self, c: MgmtdClient, a: argparse.Namespace) -> None:
        if a.what == "user" and a.action == "add":
            role = common_pb2.ROLE_ADMIN if a.admin else common_pb2.ROLE_USER
            u = (await c.identity.create_user(mgmtd_pb2.CreateUserRequest(name=a.name, role=role))).user
            self.print(f"user {u.name} (uid {u.uid})")
        elif a.what == "user":
            for u in (await c.identity.list_users(mgmtd_pb2.ListUsersRequest())).users:
                self.print(f"{u.name:<16} uid={u.uid}{' disabled' if u.disabled else ''}")
        elif a.action == "issue":
            r = await c.identity.issue_token(mgmtd_pb2.IssueTokenRequest(user_name=a.user))
            self.print(f"token {r.token_info.token_id} for {a.user}: {r.token}")
        elif a.action == "list":
            for t in (await c.identity.list_tokens(mgmtd_pb2.ListTokensRequest(user_name=a.user))).tokens:
                self.print(f"{t.token_id}  {t.user_name}{' revoked' if t.revoked else ''}")
        else:
            await c.identity.revoke_token(mgmtd_pb2.RevokeTokenRequest(token_id=a.token_id))
            self.print(f"token {a.token_id} revoked")

    async def init(self, a: argparse.Namespace) -> int:
        """Save where the cluster is and the token, once the cluster has accepted the token."""
        cfg = config.HfaiConfig(server=a.server, token=a.token.strip(), mgmtd=a.mgmtd)
        if not cfg.server and not cfg.mgmtd:
            raise CliError("where is the cluster? pass --mgmtd HOST:PORT (or --server HOST:PORT, the scheduler)")
        try:
            async with SchedulerApi.from_config(cfg) as api:
                me = await api.whoami()
        except RpcError as exc:
            if exc.code is grpc.StatusCode.UNAUTHENTICATED:
                raise CliError(f"the cluster refused this token ({exc.details}); nothing saved") from None
            raise
        path = config.save(cfg, self.environ)
        self.print(f"saved {path} (token of {me.principal.name})")
        return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hfai", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init", help="save where the cluster is and your token (checked first)")
    p.add_argument("token")
    p.add_argument("--mgmtd", default="", help="mgmtd address(es), comma-separated")
    p.add_argument("--server", default="", help="the scheduler's address (default: found through mgmtd)")
    for kind in ("python", "bash"):
        p = sub.add_parser(kind, help=f"submit a {kind} task (after --), or run it here", add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER)
    p = sub.add_parser("list", help="your tasks")
    p.add_argument("--all", action="store_true", help="every user's (admins)")
    for name in ("status", "stop", "suspend"):
        sub.add_parser(name).add_argument("task_id", type=int)
    p = sub.add_parser("priority", help="change a task's priority (a level, a name or AUTO)")
    p.add_argument("task_id", type=int)
    p.add_argument("level")
    p = sub.add_parser("logs", help="a task's log")
    p.add_argument("task_id", type=int)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--rank", type=int, default=0, help="node rank")
    sub.add_parser("nodes").add_argument("--group", default="")
    sub.add_parser("whoami", help="you, your quotas and usage")
    p = sub.add_parser("validate", help="run the node validator (admins)")
    p.add_argument("node_ids", type=int, nargs="*", help="default: every node")
    p.add_argument("--checks", default="", help="comma-separated check names; default: all")
    adm = sub.add_parser("admin").add_subparsers(dest="what", required=True)
    quota = adm.add_parser("quota").add_subparsers(dest="action", required=True)
    p = quota.add_parser("set")
    p.add_argument("user")
    p.add_argument("level")
    p.add_argument("nodes", type=int)
    p.add_argument("--group", default="default")
    quota.add_parser("list").add_argument("user", nargs="?")
    node = adm.add_parser("node").add_subparsers(dest="action", required=True)
    for action in ("enable", "disable"):
        p = node.add_parser(action)
        p.add_argument("node_id", type=int)
        p.add_argument("--reason", default="")
    user = adm.add_parser("user").add_subparsers(dest="action", required=True)
    p = user.add_parser("add")
    p.add_argument("name")
    p.add_argument("--admin", action="store_true")
    user.add_parser("list")
    token = adm.add_parser("token").add_subparsers(dest="action", required=True)
    token.add_parser("issue").add_argument("user")
    token.add_parser("list").add_argument("user")
    token.add_parser("revoke").add_argument("token_id")
    return parser


async def _dispatch(cli: _Cli, a: argparse.Namespace) -> int:
    handlers: dict[str, Any] = {
        "init": cli.init,
        "list": cli.list,
        "status": cli.status,
        "logs": cli.logs,
        "stop": cli.act,
        "suspend": cli.act,
        "priority": cli.act,
        "nodes": cli.nodes,
        "whoami": cli.whoami,
        "validate": cli.validate,
        "admin": cli.admin,
    }
    if a.cmd in ("python", "bash"):
        return await cli.submit_or_run(a.cmd, list(a.args))
    return int(await handlers[a.cmd](a))


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line; ``python``/``bash`` take everything after them as it is.

    argparse's REMAINDER would refuse a leading option such as ``--help``.
    """
    if argv and argv[0] in ("python", "bash"):
        return argparse.Namespace(cmd=argv[0], args=list(argv[1:]))
    return _build_parser().parse_args(list(argv))


def run(argv: Sequence[str], environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """Runs one ``hfai`` command line; the exit code: 2 for a usage or config error, 1 for a refused call.

    Errors are printed to ``err`` as ``hfai: ...``, not raised.
    """
    try:
        args = _parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    cli = _Cli(environ, out, err)
    try:
        return asyncio.run(_dispatch(cli, args))
    except (CliError, config.ConfigError) as exc:
        print(f"hfai: {exc}", file=err)
        return 2
    except RpcError as exc:
        print(f"hfai: {exc.code.name}: {exc.details}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130


def main() -> int:
    """The ``hfai`` console script: ``run`` on this process's arguments, environment and streams."""
    try:
        code = run(sys.argv[1:], os.environ, sys.stdout, sys.stderr)
    except BrokenPipeError:
        code = _quiet_broken_pipe()
    # The process exits next: the interpreter's teardown would garbage-collect every object the command imported
    # (grpc, protobuf), 0.2-0.4 s of each call on a loaded 2-core machine; frozen objects are skipped.
    gc.freeze()
    return code


def _quiet_broken_pipe() -> int:
    """The reader of our output went away (``hfai list | head -1``): stop quietly, as ``ls`` does.

    stdout is pointed at /dev/null so the interpreter's final flush does not fail again; exit 141
    (128 + SIGPIPE), what a shell reports for a command a broken pipe ended.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


if __name__ == "__main__":
    sys.exit(main())
