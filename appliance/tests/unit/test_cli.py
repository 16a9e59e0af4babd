"""Argument parsing, and how commands find the cluster and the token."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from ff_appliance import admin
from ff_appliance.cli import Cli, CliError, _mgmtd_addresses, _token, build_parser, run
from ff_appliance.state import ClusterPlan, InstancePlan, StateDir, save_plan, write_secret


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_up_options() -> None:
    args = _parse("up", "--state-dir", "/x", "--mgmtd", "3", "--timeout-s", "5")
    assert (args.state_dir, args.num_mgmtd, args.timeout_s, args.log_level) == ("/x", 3, 5.0, "INFO")
    assert _parse("up").num_mgmtd is None


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["up", "--mgmtd", "0"],
        ["up", "--mgmtd", "x"],
        ["frob"],
        ["user"],
        ["user", "add"],
        ["group", "add-member", "g"],
        ["token", "revoke"],
        ["status", "--bogus"],
        ["demo", "--faults", "fire"],
        ["demo", "--faults", ","],
        ["demo", "--quick", "--faults", "agent"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run(argv, {}, io.StringIO(), io.StringIO())
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_demo_faults_are_a_subset_of_the_kinds() -> None:
    assert _parse("demo", "--faults", "hang, agent").faults == ("hang", "agent")
    assert _parse("demo").faults is None and not _parse("demo").quick  # every fault
    assert _parse("demo", "--quick").faults is None


def test_identity_commands_parse_to_their_calls() -> None:
    args = _parse("user", "add", "bob", "--admin", "--uid", "2000", "--group", "a", "--group", "b")
    assert (args.name, args.admin, args.uid, args.group, args.json) == ("bob", True, 2000, ["a", "b"], False)
    args = _parse("token", "issue", "--user", "bob", "--ttl-s", "60", "--description", "ci", "--json")
    assert (args.user, args.ttl_s, args.description, args.json) == ("bob", 60.0, "ci", True)
    assert args.render is admin.render_issued
    args = _parse("group", "remove-member", "team", "bob", "--mgmtd", "h:1,h:2", "--token", "t")
    assert (args.group, args.user, args.mgmtd, args.token) == ("team", "bob", ["h:1,h:2"], "t")


def _cli(environ: dict[str, str] | None = None) -> Cli:
    return Cli(environ=environ or {}, out=io.StringIO())


def test_state_dir_from_flag_then_env_then_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _cli().state(_parse("status")).root == tmp_path / ".fireflyer"
    assert _cli({"FF_STATE_DIR": "env"}).state(_parse("status")).root == tmp_path / "env"
    flagged = _cli({"FF_STATE_DIR": "env"}).state(_parse("status", "--state-dir", "flag"))
    assert flagged.root == tmp_path / "flag"


def test_addresses_from_flag_or_plan(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    with pytest.raises(CliError, match="no cluster"):
        _mgmtd_addresses(_parse("whoami"), state, _cli())
    plan = ClusterPlan(
        instances=(InstancePlan(name="mgmtd-1", service="mgmtd", node_id=1, grpc_port=5, metrics_port=6),)
    )
    save_plan(state, plan)
    assert _mgmtd_addresses(_parse("whoami"), state, _cli()) == ["127.0.0.1:5"]
    flagged = _parse("whoami", "--mgmtd", "a:1,b:2", "--mgmtd", "c:3")
    assert _mgmtd_addresses(flagged, state, _cli()) == ["a:1", "b:2", "c:3"]


def test_token_from_flag_then_env_then_admin_token(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    with pytest.raises(CliError, match="no token"):
        _token(_parse("whoami"), state, _cli())
    write_secret(state.admin_token_file, "from-file")
    assert _token(_parse("whoami"), state, _cli()) == "from-file"
    assert _token(_parse("whoami"), state, _cli({"FF_TOKEN": "from-env"})) == "from-env"
    assert _token(_parse("whoami", "--token", "flag"), state, _cli({"FF_TOKEN": "e"})) == "flag"


def test_commands_without_a_cluster_fail_with_exit_1(tmp_path: Path) -> None:
    err = io.StringIO()
    assert run(["status", "--state-dir", str(tmp_path)], {}, io.StringIO(), err) == 1
    assert err.getvalue().startswith(f"fireflyer: no cluster in {tmp_path}")
    err = io.StringIO()
    assert run(["user", "list", "--state-dir", str(tmp_path)], {}, io.StringIO(), err) == 1
    assert "no cluster" in err.getvalue()


def test_down_without_a_cluster_is_a_no_op(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run(["down", "--state-dir", str(tmp_path)], {}, out, io.StringIO()) == 0
    assert "nothing to stop" in out.getvalue()
