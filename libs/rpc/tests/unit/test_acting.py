"""Acting for another user (``ff-act-as``): who may, and what the call then runs as."""

from __future__ import annotations

import pytest

from ff_rpc import Identity, InvalidArgument, PermissionDenied, Principal, Role, acting_as
from ff_rpc.acting import MAX_ID, acting_principal, current_acting, parse_identity
from ff_rpc.auth import CLUSTER_PRINCIPAL, CLUSTER_PRINCIPAL_NAME

ADMIN = Principal(uid=7, name="ops", role=Role.ADMIN, gids=(7,))
USER = Principal(uid=1000, name="alice", gids=(1000,))


def test_the_header_round_trips() -> None:
    who = Identity(65534, (65533, 10, 0))
    assert parse_identity(who.header()) == who
    assert parse_identity("5:") == Identity(5, ())


@pytest.mark.parametrize("value", ["", "5", "x:1", "5:1,,2", "-1:1", f"{MAX_ID + 1}:1", "5:1,y", "5 :1"])
def test_malformed_headers_are_invalid_arguments(value: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_identity(value)


def test_an_admin_or_the_cluster_runs_a_call_as_the_uid_and_groups_sent() -> None:
    for trusted in (ADMIN, CLUSTER_PRINCIPAL):
        p = acting_principal(trusted, "1001:100,1001")
        assert (p.uid, p.gids, p.role, p.is_admin, p.is_cluster) == (1001, (100, 1001), Role.USER, False, False)
        assert p.name == f"{trusted.name} as uid 1001"
    root = acting_principal(ADMIN, "0:0")
    assert (root.uid, root.is_admin) == (0, True)  # root on the machine is root in the file system
    assert CLUSTER_PRINCIPAL.name == CLUSTER_PRINCIPAL_NAME


def test_a_user_may_not_act_for_anyone() -> None:
    for value in ("1001:1001", "0:0", "1000:1000"):
        with pytest.raises(PermissionDenied):
            acting_principal(USER, value)


def test_acting_as_sets_the_identity_for_its_block_only() -> None:
    assert current_acting() is None
    with acting_as(Identity(1, (2,))):
        assert current_acting() == Identity(1, (2,))
        with acting_as(None):
            assert current_acting() is None
        assert current_acting() == Identity(1, (2,))
    assert current_acting() is None
