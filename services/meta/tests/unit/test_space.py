"""StatFs's usable space from the targets' disk reports: each file system once, divided by the replication."""

from __future__ import annotations

from fractions import Fraction

from ff_meta.core.space import TargetSpace, UsableSpace, replicas_per_chain, usable_space

GIB = 1 << 30


def test_targets_on_one_file_system_count_it_once() -> None:
    six_on_a = [TargetSpace("host-a:64769", 300 * GIB, 90 * GIB)] * 6
    reports = [*six_on_a, TargetSpace("host-b:64769", 150 * GIB, 60 * GIB)]
    assert usable_space(reports, Fraction(3)) == UsableSpace(150 * GIB, 50 * GIB, 2)


def test_the_same_device_number_on_two_hosts_is_two_file_systems() -> None:
    reports = [TargetSpace("boot-1:2049", 10 * GIB, 4 * GIB), TargetSpace("boot-2:2049", 10 * GIB, 4 * GIB)]
    assert usable_space(reports, Fraction(1)) == UsableSpace(20 * GIB, 8 * GIB, 2)


def test_uneven_replication_divides_by_the_mean_chain_length() -> None:
    replication = replicas_per_chain([3, 3, 2, 0])
    assert replication == Fraction(8, 3)
    assert usable_space([TargetSpace("h:1", 8 * GIB, 8 * GIB)], replication) == UsableSpace(3 * GIB, 3 * GIB, 1)
    assert replicas_per_chain([]) == 1


def test_no_capacity_reported_gives_none_for_the_fallback() -> None:
    assert usable_space([], Fraction(3)) is None
    # Targets of an old storage build: no file-system id and zero capacity.
    assert usable_space([TargetSpace("", 0, 0), TargetSpace("h:1", 0, 0)], Fraction(3)) is None


def test_free_never_exceeds_capacity() -> None:
    assert usable_space([TargetSpace("h:1", GIB, 2 * GIB)], Fraction(1)) == UsableSpace(GIB, GIB, 1)
