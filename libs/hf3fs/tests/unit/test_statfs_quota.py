"""``df`` of a folder under a byte quota shows the quota when it leaves less room than the cluster."""

from __future__ import annotations

from hf3fs import Quota, StatFs
from hf3fs.statfs import within_quotas

GIB = 1 << 30
CLUSTER = StatFs(capacity_bytes=90 * GIB, used_bytes=5 * GIB, free_bytes=26 * GIB, num_inodes=1000)


def test_a_small_quota_gives_its_limit_use_and_room() -> None:
    q = Quota("/home/a", max_bytes=10 * GIB, max_inodes=None, used_bytes=4 * GIB, used_inodes=7)
    assert within_quotas(CLUSTER, [q]) == StatFs(10 * GIB, 4 * GIB, 6 * GIB, 1000)


def test_the_quota_with_least_room_wins_among_nested_ones() -> None:
    inner = Quota("/home/a/p", max_bytes=8 * GIB, max_inodes=None, used_bytes=1 * GIB, used_inodes=1)
    outer = Quota("/home/a", max_bytes=10 * GIB, max_inodes=None, used_bytes=9 * GIB, used_inodes=9)
    assert within_quotas(CLUSTER, [inner, outer]) == StatFs(10 * GIB, 9 * GIB, 1 * GIB, 1000)


def test_a_quota_with_more_room_than_the_cluster_changes_nothing() -> None:
    q = Quota("/big", max_bytes=500 * GIB, max_inodes=None, used_bytes=GIB, used_inodes=1)
    assert within_quotas(CLUSTER, [q]) == CLUSTER


def test_inode_only_quotas_and_none_change_nothing() -> None:
    assert within_quotas(CLUSTER, []) == CLUSTER
    q = Quota("/n", max_bytes=None, max_inodes=10, used_bytes=0, used_inodes=3)
    assert within_quotas(CLUSTER, [q]) == CLUSTER


def test_a_quota_over_its_limit_has_no_room() -> None:
    q = Quota("/o", max_bytes=GIB, max_inodes=None, used_bytes=2 * GIB, used_inodes=1)
    assert within_quotas(CLUSTER, [q]) == StatFs(GIB, GIB, 0, 1000)
