"""The accumulation rule's building blocks: bf16 rounding, widening, and the reduce operators."""

from __future__ import annotations

import numpy as np
import pytest

from hfreduce.reduction import DType, ReduceOp, bf16_bits, bf16_values, combine_fn, from_f32, to_f32


def test_bf16_rounds_to_nearest_even() -> None:
    one = 1.0
    ulp = 2.0**-7  # spacing of bf16 just above 1
    values = [one, one + ulp / 2, one + 3 * ulp / 2, one + ulp / 4, -2.5, 0.0, -0.0]
    got = bf16_values(bf16_bits(values))
    assert got.tolist() == [one, one, one + 2 * ulp, one, -2.5, 0.0, -0.0]
    assert np.signbit(got[-1])


def test_bf16_keeps_inf_and_nan_and_overflows_to_inf() -> None:
    got = bf16_values(bf16_bits([np.inf, -np.inf, np.nan, 3.4e38]))
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2]) and got[3] == np.inf


def test_bf16_matches_torch_rounding() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3
    ours = bf16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", list(DType))
def test_widening_then_rounding_is_the_identity_on_representable_values(dtype: DType) -> None:
    src = np.random.default_rng(1).standard_normal(257).astype(np.float32)
    stored = np.empty(len(src), dtype=dtype.storage)
    from_f32(dtype, src, stored, np.empty(len(src), dtype=np.uint32))
    wide = np.empty(len(src), dtype=np.float32)
    to_f32(dtype, stored, wide)
    again = np.empty_like(stored)
    from_f32(dtype, wide, again, np.empty(len(src), dtype=np.uint32))
    assert np.array_equal(stored, again)


@pytest.mark.parametrize(
    ("op", "expect"),
    [
        (ReduceOp.SUM, [5.0, 1.0]),
        (ReduceOp.AVG, [5.0, 1.0]),
        (ReduceOp.MAX, [3.0, 2.0]),
        (ReduceOp.MIN, [2.0, -1.0]),
    ],
)
def test_combine_applies_the_operator(op: ReduceOp, expect: list[float]) -> None:
    a, b = np.array([2.0, 2.0], np.float32), np.array([3.0, -1.0], np.float32)
    out = np.empty(2, np.float32)
    combine_fn(op)(a, b, out)
    assert out.tolist() == expect


def test_max_propagates_nan() -> None:
    out = np.empty(1, np.float32)
    combine_fn(ReduceOp.MAX)(np.array([np.nan], np.float32), np.array([1.0], np.float32), out)
    assert np.isnan(out[0])
