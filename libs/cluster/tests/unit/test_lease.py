from __future__ import annotations

from ff_cluster import LeaseWatch, lease_expired


def test_lease_is_over_after_its_duration_not_at_it() -> None:
    assert not lease_expired(100.0, 105.0, 10.0)
    assert not lease_expired(100.0, 110.0, 10.0)
    assert lease_expired(100.0, 110.001, 10.0)


def test_lease_watch_reports_loss_after_half_the_lease_once() -> None:
    watch = LeaseWatch(duration_s=10.0, last_ack=0.0)
    assert watch.tolerance_s == 5.0
    assert not watch.check(5.0)  # exactly T/2: still fine
    assert watch.check(5.1)  # past T/2: lost, reported once
    assert watch.lost
    assert not watch.check(7.0)
    assert watch.acked(8.0)  # contact regained, reported once
    assert not watch.lost
    assert not watch.acked(9.0)
    assert not watch.check(13.9)
    assert watch.check(14.1)


def test_each_ack_restarts_the_tolerance() -> None:
    watch = LeaseWatch(duration_s=2.0, last_ack=0.0)
    for now in (0.5, 1.0, 1.5, 2.0, 2.5):
        assert not watch.check(now)
        watch.acked(now)
    assert not watch.check(3.5)
    assert watch.check(3.51)
