"""The bucket plan and the order buckets are launched in (pure: no group, no processes)."""

from __future__ import annotations

import pytest

from haiscale.ddp.buckets import LaunchOrder, ParamInfo, cap_bytes_of, plan_buckets


def f32(numel: int) -> ParamInfo:
    return ParamInfo(numel=numel, itemsize=4, kind="torch.float32@cpu")


def test_parameters_fill_buckets_last_first_up_to_the_cap() -> None:
    buckets = plan_buckets([f32(10), f32(10), f32(10), f32(10)], cap_bytes=80)
    assert [[s.param for s in b.slots] for b in buckets] == [[3, 2], [1, 0]]
    assert [(s.offset, s.numel) for s in buckets[0].slots] == [(0, 10), (10, 10)]
    assert [b.nbytes for b in buckets] == [80, 80]


def test_a_parameter_larger_than_the_cap_gets_a_bucket_of_its_own() -> None:
    buckets = plan_buckets([f32(3), f32(100), f32(3)], cap_bytes=16)
    assert [[s.param for s in b.slots] for b in buckets] == [[2], [1], [0]]


def test_kinds_never_share_a_bucket_and_buckets_are_numbered_by_opening() -> None:
    half = ParamInfo(numel=4, itemsize=2, kind="torch.float16@cpu")
    buckets = plan_buckets([f32(4), half, f32(4), half], cap_bytes=1 << 20)
    assert [(b.kind, [s.param for s in b.slots]) for b in buckets] == [
        ("torch.float16@cpu", [3, 1]),
        ("torch.float32@cpu", [2, 0]),
    ]
    assert buckets[0].itemsize == 2 and buckets[0].nbytes == 16


def test_cap_in_mib_and_refused_when_not_positive() -> None:
    assert cap_bytes_of(None) == 25 << 20
    assert cap_bytes_of(0.5) == 1 << 19
    with pytest.raises(ValueError, match="bucket_cap_mb must be positive"):
        plan_buckets([f32(1)], cap_bytes=0)


def test_buckets_launch_in_index_order_whatever_order_gradients_arrive() -> None:
    buckets = plan_buckets([f32(1)] * 6, cap_bytes=8)  # buckets: [5, 4], [3, 2], [1, 0]
    order = LaunchOrder(buckets, 6)
    assert order.mark_ready(0) == []
    assert order.mark_ready(1) == []  # bucket 2 is full but waits for buckets 0 and 1
    assert order.mark_ready(5) == []
    assert order.mark_ready(4) == [0]
    assert order.unready() == [2, 3]
    assert order.mark_ready(2) == []
    assert order.mark_ready(3) == [1, 2]
    assert order.launched == 3
    with pytest.raises(RuntimeError, match="ready twice"):
        order.mark_ready(3)
    order.reset()
    assert order.launched == 0 and order.unready() == [0, 1, 2, 3, 4, 5]
