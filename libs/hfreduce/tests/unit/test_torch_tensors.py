"""The torch backend's pure pieces: which reductions it accepts, the gather fallback's local reduce, bytes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from hfreduce.distributed import tensors as tx  # noqa: E402


@pytest.mark.parametrize(
    ("op", "dtype", "message"),
    [
        ("BAND", torch.float32, "all_reduce with BAND needs an integer or bool tensor, not torch.float32"),
        ("AVG", torch.int64, "all_reduce with AVG needs a floating-point tensor, not torch.int64"),
        ("MAX", torch.complex64, "all_reduce with MAX is not defined for torch.complex64"),
    ],
)
def test_reductions_that_cannot_work_are_refused_naming_op_and_dtype(op: str, dtype: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        tx.reduce_op(getattr(dist.ReduceOp, op), "all_reduce", dtype)


def test_premul_sum_carries_its_factor() -> None:
    assert tx.reduce_op(dist._make_nccl_premul_sum(0.25), "all_reduce", torch.float32) == ("PREMUL_SUM", 0.25)


@pytest.mark.parametrize(
    ("op", "want"), [("SUM", [6, 0]), ("PRODUCT", [6, -2]), ("MAX", [3, 2]), ("MIN", [1, -1]), ("BXOR", [0, 2])]
)
def test_the_fallback_reduces_every_ranks_copy_exactly(op: str, want: list[int]) -> None:
    rows = [torch.tensor([2, 2]), torch.tensor([3, -1]), torch.tensor([1, -1 if op != "PRODUCT" else 1])]
    got = tx.combine(rows, op)
    assert got.tolist() == want
    assert got.dtype == torch.int64
    assert rows[0].tolist() == [2, 2]  # the inputs are left alone


def test_any_tensor_is_seen_as_its_bytes_and_written_back() -> None:
    t = torch.arange(6, dtype=torch.int16).view(2, 3).t()  # not contiguous: a copy, written back by finish
    raw, finish = tx.host_bytes(t)
    assert raw.dtype == torch.uint8 and raw.numel() == 12
    raw.copy_(torch.arange(12, dtype=torch.uint8))
    finish()
    assert tx.as_dtype(raw, t).tolist() == t.tolist()
    own = torch.zeros(4)
    view, _ = tx.host_bytes(own)
    assert view.data_ptr() == own.data_ptr()  # contiguous CPU: its own memory, no copy


def test_bytes_that_start_off_the_element_size_are_read_all_the_same() -> None:
    raw = torch.zeros(13, dtype=torch.uint8)
    raw[1:9].copy_(torch.tensor([7], dtype=torch.int64).view(torch.uint8))
    assert tx.as_dtype(raw[1:9], torch.zeros(1, dtype=torch.int64)).tolist() == [7]
