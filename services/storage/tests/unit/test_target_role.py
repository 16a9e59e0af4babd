"""A target's own side of the state machine: what it reports and serves, and how it goes through recovery."""

from __future__ import annotations

from ff_storage.core.target_role import Local, Public, TargetRole


def test_serving_target_reports_uptodate_and_serves() -> None:
    role = TargetRole()
    role.observe(Public.SERVING, 3)
    assert role.report() is Local.UPTODATE
    assert role.may_read(lease_ok=True) and role.may_update(lease_ok=True)
    assert not role.may_read(lease_ok=False) and not role.may_update(lease_ok=False)


def test_needs_recovery_reports_offline_until_routed_away_then_syncs() -> None:
    role = TargetRole()
    role.observe(Public.SERVING, 3)
    role.needs_recovery()
    # still publicly serving: it must not serve or take updates, and it tells mgmtd it is offline
    assert role.report() is Local.OFFLINE
    assert not role.may_read(lease_ok=True) and not role.may_update(lease_ok=True)
    role.observe(Public.SERVING, 3)
    assert role.report() is Local.OFFLINE
    # mgmtd moved it out of the chain: from here it is an ordinary returning target
    role.observe(Public.OFFLINE, 4)
    assert role.report() is Local.ONLINE
    role.observe(Public.WAITING, 5)
    assert role.report() is Local.ONLINE
    role.observe(Public.SYNCING, 6)
    assert role.may_update(lease_ok=True) and not role.may_read(lease_ok=True)
    assert role.report() is Local.ONLINE
    role.sync_done(6)
    assert role.report() is Local.UPTODATE
    role.observe(Public.SERVING, 7)
    assert role.may_read(lease_ok=True)


def test_a_lease_lapsing_at_a_target_routed_nothing_does_not_keep_it_offline() -> None:
    """Seen after mgmtd restarted: the lease lapsed, mgmtd made the target its chain's lastsrv, the lease lapsed
    again. It reported offline for good (it waited for routing that would never change), and no chain came back."""
    role = TargetRole()
    role.observe(Public.SERVING, 3)
    role.needs_recovery()  # the lease lapsed while serving: offline until routed away
    role.observe(Public.LASTSRV, 7)
    assert role.report() is Local.ONLINE
    role.needs_recovery()  # and lapsed again: nothing is routed to it, nothing to wait for
    assert role.report() is Local.ONLINE
    assert not role.may_read(lease_ok=True) and not role.may_update(lease_ok=True)
    role.observe(Public.SERVING, 8)
    assert role.report() is Local.UPTODATE and role.may_read(lease_ok=True)


def test_publicly_lastsrv_or_offline_target_serves_nothing() -> None:
    for public in (Public.LASTSRV, Public.OFFLINE):
        role = TargetRole()
        role.observe(public, 2)
        assert role.down
        assert not role.may_read(lease_ok=True) and not role.may_update(lease_ok=True)
