"""The agent's pure decisions: start-order checks, the ranks' environment, the root cause of a failure,
the suspend deadlines, and hang detection."""

from __future__ import annotations

import json
import re
import signal
from dataclasses import replace

import pytest

from ff_agent.core.errors import CannotRunAs, InvalidRequest
from ff_agent.core.failures import ErrorRecord, FailureClass, RankExit, root_cause
from ff_agent.core.hang import RankProgress, lagging_ranks, stopped_hangs, track_stopped
from ff_agent.core.launch import NodeFacts, Owner, RanksRunAs, RunAs, StartOrder, check_order, plan_ranks, ranks_user
from ff_agent.core.suspend import SuspendClock
from hfreduce.config import options_from_env

NODE = NodeFacts(device_indices=(0, 1), gpus=False, scheduler_address="s:1", mgmtd_addresses="m:1")
ORDER = StartOrder(
    task_id=7,
    run_id=70,
    argv=("python", "t.py"),
    node_rank=1,
    num_nodes=2,
    master_ip="10.0.0.1",
    master_port=2222,
    token="tok",
    whole_life_state=5,
    env={"RANK": "9", "X": "y"},
)


def _plan(order: StartOrder = ORDER, node: NodeFacts = NODE) -> list[dict[str, str]]:
    devices = check_order(order, node)
    base = {"PATH": "/bin", "FF_AGENT_CLUSTER_TOKEN": "secret", "HOME": "/root"}
    plans = plan_ranks(
        order,
        node,
        devices,
        base_env=base,
        run_dir="/r",
        error_dir="/e",
        hook_dir="/h",
        collective_file="/c/control.json",
    )
    return [p.env for p in plans]


def test_every_rank_gets_the_hai_variables_and_the_agents_win() -> None:
    envs = _plan()
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    for i, env in enumerate(envs):
        assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_IP"] == "10.0.0.1" and env["MASTER_PORT"] == "2222"
        assert env["MARSV2_TASK_ID"] == "7" and env["MARSV2_RUN_ID"] == "70"
        assert env["MARSV2_WHOLE_LIFE_STATE"] == "5" and env["HFAI_TOKEN"] == "tok" and env["HFAI_RUN_DIR"] == "/r"
        assert env["X"] == "y" and env["PATH"] == "/bin" and "FF_AGENT_CLUSTER_TOKEN" not in env
        assert env["FF_DEVICE_INDEX"] == str(i) and "CUDA_VISIBLE_DEVICES" not in env
        assert env["FF_RANK_ERROR_FILE"] == f"/e/rank{i}.json" and env["PYTHONPATH"].split(":")[0] == "/h"
        assert env["FF_HFREDUCE_CONTROL_FILE"] == "/c/control.json"  # where a store-formed group says its server is


def test_the_cluster_client_variables_are_the_runs_and_no_secret_of_the_agent_leaks() -> None:
    base = {
        "FF_TOKEN": "agent-admin",
        "FF_MGMTD_ADDRESSES": "elsewhere:1",
        "HFAI_TOKEN": "agent",
        "FF_META_CLUSTER_TOKEN": "s1",
        "MY_CLUSTER_TOKEN_FILE": "/s",
        "LANG": "C",
    }
    order = replace(ORDER, env={"FF_TOKEN": "mine?"})
    env = plan_ranks(order, NODE, (0,), base_env=base, run_dir="/r", error_dir="/e", hook_dir="/h")[0].env
    assert (env["FF_TOKEN"], env["FF_MGMTD_ADDRESSES"], env["HFAI_TOKEN"]) == ("tok", "m:1", "tok")
    assert env["LANG"] == "C" and not [k for k in env if "CLUSTER_TOKEN" in k]


ALICE = Owner(uid=3000, name="alice", gids=(500, 501))


def test_ranks_run_as_the_tokens_user_with_the_registrys_groups() -> None:
    assert ranks_user("alice", ALICE, mode=RanksRunAs.TASK_USER, agent_uid=0) == RunAs(
        uid=3000, gid=500, groups=(500, 501), user_name="alice"
    )
    no_groups = ranks_user("", replace(ALICE, gids=()), mode=RanksRunAs.TASK_USER, agent_uid=0)
    assert no_groups is not None and (no_groups.gid, no_groups.groups) == (3000, ())
    assert ranks_user("alice", ALICE, mode=RanksRunAs.AGENT_USER, agent_uid=0) is None
    assert ranks_user("alice", ALICE, mode=RanksRunAs.TASK_USER, agent_uid=3000) is None  # it is the agent's uid


@pytest.mark.parametrize(
    ("owner", "order_user", "agent_uid", "error", "says"),
    [
        (replace(ALICE, is_cluster=True, uid=0), "", 0, InvalidRequest, "never the cluster's or root's"),
        (replace(ALICE, uid=0), "alice", 0, InvalidRequest, "never the cluster's or root's"),
        (ALICE, "bob", 0, InvalidRequest, "not to the task's user 'bob'"),
        (ALICE, "alice", 1000, CannotRunAs, "not root"),
    ],
)
def test_ranks_user_refuses_root_other_users_and_what_a_plain_agent_cannot_do(
    owner: Owner, order_user: str, agent_uid: int, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=re.escape(says)):
        ranks_user(order_user, owner, mode=RanksRunAs.TASK_USER, agent_uid=agent_uid)


def test_gpus_are_made_visible_one_per_rank_and_shared_when_ranks_differ() -> None:
    gpus = replace(NODE, gpus=True)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in _plan(node=gpus)] == ["0", "1"]
    three = _plan(replace(ORDER, ranks_per_node=3), gpus)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in three] == ["0,1"] * 3
    assert _plan(replace(ORDER, device_indices=(1,)), gpus)[0]["CUDA_VISIBLE_DEVICES"] == "1"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"device_indices": (0, 3)}, "no devices [3]"),
        ({"device_indices": (1, 1)}, "repeated"),
        ({"argv": ()}, "empty"),
        ({"argv": ("  ",)}, "empty"),
        ({"token": ""}, "token"),
        ({"node_rank": 2}, "node_rank"),
        ({"master_port": 0}, "master_port"),
        ({"env": {"A=B": "1"}}, "env"),
        ({"run_id": 0}, "run_id"),
    ],
)
def test_bad_orders_are_refused(change: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(says)):
        check_order(replace(ORDER, **change), NODE)  # type: ignore[arg-type]


def _exit(rank: int, *, code: int = 0, sig: int = 0, at: float = 100.0, **kw: object) -> RankExit:
    return RankExit(local_rank=rank, exit_code=code, signal=sig, exited_at=at, **kw)  # type: ignore[arg-type]


def test_the_first_failure_by_time_is_the_root_cause() -> None:
    victim = _exit(0, code=1, at=105.0, error=ErrorRecord(timestamp=104.0, exc_type="PeerFailureError", message="x"))
    culprit = _exit(1, code=1, at=106.0, error=ErrorRecord(timestamp=103.0, exc_type="ValueError", message="bad lr"))
    failure = root_cause([victim, culprit, _exit(2)])
    assert failure is not None and failure.local_rank == 1 and failure.failure_class is FailureClass.USER
    assert "ValueError: bad lr" in failure.message
    assert root_cause([_exit(0), _exit(1, code=1, stopped_by_agent=True)]) is None


@pytest.mark.parametrize(
    ("rank", "cls"),
    [
        (_exit(0, code=3, log_tail="Traceback\nboom\n"), FailureClass.USER),
        (_exit(0, sig=signal.SIGSEGV), FailureClass.USER),
        (_exit(0, sig=signal.SIGKILL), FailureClass.INFRASTRUCTURE),
        (_exit(0, sig=signal.SIGBUS), FailureClass.INFRASTRUCTURE),
        (_exit(0, code=127), FailureClass.PLATFORM),
        (
            _exit(0, code=1, error=ErrorRecord(timestamp=1, exc_type="PeerFailureError", message="")),
            FailureClass.INFRASTRUCTURE,
        ),
    ],
)
def test_failures_are_classified(rank: RankExit, cls: FailureClass) -> None:
    failure = root_cause([rank])
    assert failure is not None and failure.failure_class is cls


def test_suspend_deadlines_on_the_flag_node_and_elsewhere() -> None:
    flag = SuspendClock(requested_at=0.0, ack_window_s=5.0, grace_s=20.0, term_grace_s=1.0, flag_node=True)
    assert flag.stop_due(4.9) is None
    assert "not acknowledged" in (flag.stop_due(5.0) or "")
    flag.received(3.0)
    assert flag.stop_due(22.9) is None and "grace" in (flag.stop_due(23.0) or "")
    flag.go_suspend(10.0)
    assert "go_suspend" in (flag.stop_due(10.0) or "")
    other = SuspendClock(requested_at=0.0, ack_window_s=5.0, grace_s=20.0, term_grace_s=1.0, flag_node=False)
    assert other.stop_due(24.9) is None and other.stop_due(25.0) is not None


def _p(rank: int, seq: int, done: int, since: float, state: str = "") -> RankProgress:
    state = state or ("in_collective" if seq > done else "idle")
    return RankProgress(
        rank=rank,
        node_rank=rank // 2,
        local_rank=rank % 2,
        seq=seq,
        done=done,
        op="allreduce",
        since=since,
        state=state,
    )


def test_a_rank_behind_the_others_collective_past_the_threshold_is_hung() -> None:
    ranks = [_p(0, 8, 7, 100.0), _p(1, 8, 7, 101.0), _p(2, 7, 7, 90.0), _p(3, 8, 7, 100.5)]
    assert lagging_ranks(ranks, 120.0, 30.0) == []
    hung = lagging_ranks(ranks, 131.0, 30.0)
    assert [(h.rank, h.node_rank, h.local_rank, h.stuck_seq, h.waiting_seq) for h in hung] == [(2, 1, 0, 7, 8)]
    assert "rank 2" in hung[0].message
    # Everyone in step, or only one rank left: nothing to name.
    assert lagging_ranks([_p(0, 8, 8, 0.0), _p(1, 8, 8, 0.0)], 1e6, 1.0) == []
    assert lagging_ranks([_p(0, 8, 7, 0.0), _p(1, 7, 7, 0.0, "dead")], 1e6, 1.0) == []


def test_a_rank_stopped_past_the_threshold_is_hung_and_one_that_ran_again_is_forgotten() -> None:
    since = track_stopped({}, {1}, 100.0)
    since = track_stopped(since, {0, 1}, 103.0)
    assert since == {0: 103.0, 1: 100.0}
    assert stopped_hangs(since, 104.0, 5.0, node_rank=1, ranks_per_node=2) == []
    (hung,) = stopped_hangs(since, 105.0, 5.0, node_rank=1, ranks_per_node=2)
    assert (hung.rank, hung.node_rank, hung.local_rank, hung.stopped) == (3, 1, 1, True)
    assert hung.message.startswith("hang: rank 3 (node rank 1, local rank 1) is stopped")
    assert track_stopped(since, {0}, 106.0) == {0: 103.0}  # local rank 1 runs again: its clock starts over


def test_every_rank_gets_its_telemetry_labels_and_the_order_cannot_change_them() -> None:
    node = NodeFacts(device_indices=(0, 1), gpus=False, hostname="n7")
    order = replace(ORDER, env={"FF_TELEMETRY_LABELS": '{"task_id": "1"}'})
    labels = [json.loads(env["FF_TELEMETRY_LABELS"]) for env in _plan(order, node)]
    assert labels == [
        {"task_id": "7", "run_id": "70", "node_rank": "1", "rank": str(2 + i), "local_rank": str(i), "node": "n7"}
        for i in range(2)
    ]


def test_ranks_learn_their_nodes_zone_for_hfreduces_trees_and_the_order_cannot_change_it() -> None:
    zoned = replace(NODE, zone="rack-b")
    order = replace(ORDER, env={"FF_HFREDUCE_ZONE": "rack-a"})
    assert [env["FF_HFREDUCE_ZONE"] for env in _plan(order, zoned)] == ["rack-b", "rack-b"]
    assert options_from_env(_plan(ORDER, zoned)[0])["zone"] == "rack-b"  # what hfreduce reads
    assert "FF_HFREDUCE_ZONE" not in _plan(ORDER, NODE)[0]  # no zone configured: hfreduce's default
