"""The ``fireflyer user|group|token|whoami`` commands against a real cluster: answers and exit codes."""

from __future__ import annotations

from .conftest import Appliance, wait_for_code


def _secret(issued: str) -> str:
    lines = [line for line in issued.splitlines() if line.startswith("secret: ")]
    assert len(lines) == 1, issued
    return lines[0].removeprefix("secret: ")


def test_users_groups_and_tokens(appliance: Appliance) -> None:
    appliance.ok("up")
    missing_group = appliance.run("user", "add", "alice", "--group", "team")
    assert (missing_group.code, missing_group.err) == (1, "fireflyer: NOT_FOUND: group 'team' does not exist\n")
    assert "group team: gid" in appliance.ok("group", "add", "team").out
    assert (
        "user alice: uid 3000, role user, enabled, groups team"
        in appliance.ok("user", "add", "alice", "--uid", "3000", "--group", "team").out
    )
    again = appliance.run("user", "add", "alice")
    assert again.code == 1
    assert again.err.startswith("fireflyer: ALREADY_EXISTS: ")
    bad_name = appliance.run("user", "add", "Not A Name")
    assert bad_name.code == 1
    assert bad_name.err.startswith("fireflyer: INVALID_ARGUMENT: ")

    users = appliance.ok("user", "list", "--json").json()["users"]
    assert {u["name"]: u["role"] for u in users} == {
        "admin": "ROLE_ADMIN",
        "alice": "ROLE_USER",
        "hfai-demo": "ROLE_USER",
    }
    secret = _secret(appliance.ok("token", "issue", "--user", "alice", "--description", "e2e").out)

    # As alice: who she is; an admin call is refused; her own tokens are hers to see.
    assert appliance.ok("whoami", "--token", secret).out == "alice (uid 3000, role user, groups team)\n"
    assert appliance.ok("whoami", env={"FF_TOKEN": secret}).out.startswith("alice ")
    denied = appliance.run("user", "list", "--token", secret)
    assert denied.code == 1
    assert denied.err == "fireflyer: PERMISSION_DENIED: user 'alice' is not an admin\n"
    tokens = appliance.ok("token", "list", "--token", secret, "--json").json()["tokens"]
    assert [(t["user_name"], t["description"], t.get("revoked", False)) for t in tokens] == [("alice", "e2e", False)]

    wrong = appliance.run("whoami", "--token", "fft_not_a_real_token")
    assert wrong.code == 1
    assert wrong.err.startswith("fireflyer: UNAUTHENTICATED: ")

    # Revoked and disabled: the token stops working.
    assert "revoked" in appliance.ok("token", "revoke", tokens[0]["token_id"]).out
    revoked = wait_for_code(appliance, "UNAUTHENTICATED", "whoami", "--token", secret)
    assert revoked.code == 1
    assert revoked.err.startswith("fireflyer: UNAUTHENTICATED: ")
    second = _secret(appliance.ok("token", "issue", "--user", "alice").out)
    assert "disabled" in appliance.ok("user", "disable", "alice").out
    assert wait_for_code(appliance, "UNAUTHENTICATED", "whoami", "--token", second).code == 1
    assert "enabled" in appliance.ok("user", "enable", "alice").out
    assert appliance.ok("whoami", "--token", second).out.startswith("alice ")

    # Group membership both ways.
    assert appliance.ok("group", "remove-member", "team", "alice").out == "group team: gid 1000, members -\n"
    assert appliance.ok("group", "add-member", "team", "alice").out == "group team: gid 1000, members alice\n"
    assert "team  alice" in appliance.ok("group", "list").out


def test_usage_and_missing_cluster_errors(appliance: Appliance) -> None:
    assert appliance.run("token", "frob").code == 2
    no_cluster = appliance.run("whoami")
    assert no_cluster.code == 1
    assert no_cluster.err.startswith(f"fireflyer: no cluster in {appliance.state_dir}")
