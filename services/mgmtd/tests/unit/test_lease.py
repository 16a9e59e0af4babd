from __future__ import annotations

from ff_mgmtd.core.lease import HeartbeatTracker, LeaseRow, campaign, primary_address


def test_tracker_declares_nodes_dead_only_after_a_whole_lease() -> None:
    tracker = HeartbeatTracker(duration_s=10.0)
    tracker.reset([1, 2], now=0.0)
    tracker.renew(2, 4.0)
    assert tracker.expired(10.0) == []
    assert tracker.expired(10.5) == [1]
    assert tracker.expired(14.5) == [1, 2]  # oldest first
    tracker.forget(1)
    assert tracker.expired(20.0) == [2]
    assert tracker.last_seen(1) is None


def test_new_primary_gives_every_alive_node_a_full_lease() -> None:
    tracker = HeartbeatTracker(duration_s=5.0)
    tracker.reset([1, 2, 3], now=100.0)
    assert tracker.expired(104.9) == []
    assert tracker.expired(105.1) == [1, 2, 3]


def test_campaign_takes_a_free_lease() -> None:
    result = campaign(None, "a", "a:1", now=10.0, lease_s=4.0)
    assert result.is_primary and result.changed
    assert result.row == LeaseRow("a", "a:1", 14.0, 1)


def test_holder_renews_without_changing_epoch() -> None:
    held = LeaseRow("a", "a:1", 14.0, 3)
    result = campaign(held, "a", "a:1", now=12.0, lease_s=4.0)
    assert result.is_primary and result.row == LeaseRow("a", "a:1", 16.0, 3)


def test_standby_waits_while_the_lease_is_live_then_takes_it_with_a_new_epoch() -> None:
    held = LeaseRow("a", "a:1", 14.0, 3)
    waiting = campaign(held, "b", "b:1", now=13.9, lease_s=4.0)
    assert not waiting.is_primary and not waiting.changed and waiting.row == held
    taken = campaign(held, "b", "b:1", now=14.0, lease_s=4.0)
    assert taken.is_primary and taken.row == LeaseRow("b", "b:1", 18.0, 4)


def test_holder_whose_lease_lapsed_starts_a_new_epoch() -> None:
    lapsed = LeaseRow("a", "a:1", 14.0, 3)
    result = campaign(lapsed, "a", "a:1", now=15.0, lease_s=4.0)
    assert result.is_primary and result.row.epoch == 4


def test_primary_address_is_empty_without_a_live_lease() -> None:
    row = LeaseRow("a", "a:1", 14.0, 3)
    assert primary_address(row, 13.0) == "a:1"
    assert primary_address(row, 14.0) == ""
    assert primary_address(None, 0.0) == ""
