"""The compiled sum kernel gives numpy's results bit for bit, and refuses buffers it cannot use."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from hfreduce import _kernels
from hfreduce.counters import Counters
from hfreduce.pipeline import TreeEngine, TreeJob
from hfreduce.reduction import DType, ReduceOp, combine_fn

pytestmark = pytest.mark.unit

F32 = npt.NDArray[np.float32]
# around the kernel's 4096-element block: empty, one, odd, a block, a block and one, several blocks and a tail
LENGTHS = [0, 1, 7, 4096, 4097, 3 * 4096 + 5]


def _numpy_sum(sources: list[F32], divisor: float) -> F32:
    out = np.add(sources[0], sources[1]) if len(sources) > 1 else sources[0].copy()
    for src in sources[2:]:
        np.add(out, src, out=out)
    if divisor:
        np.divide(out, np.float32(divisor), out=out)
    return out


def _random(rng: np.random.Generator, n: int) -> F32:
    # wide exponents and signs, so any change in the order of the adds shows in the last bits
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 7, n)).astype(np.float32)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("num_sources", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("divisor", [0.0, 3.0])
def test_sum_is_numpys_bit_for_bit(n: int, num_sources: int, divisor: float) -> None:
    rng = np.random.default_rng([n, num_sources, int(divisor)])
    sources = [_random(rng, n) for _ in range(num_sources)]
    copies = [np.full(n, np.nan, dtype=np.float32) for _ in range(2)]
    out = np.full(n, np.nan, dtype=np.float32)
    _kernels.sum_into(out, sources, copies, divisor)
    want = _numpy_sum(sources, divisor)
    assert out.tobytes() == want.tobytes()
    for copy in copies:
        assert copy.tobytes() == want.tobytes()


@pytest.mark.parametrize("n", [1, 4097, 3 * 4096 + 5])
def test_in_place_and_a_copy_over_a_source(n: int) -> None:
    """A root's case: ``out`` is its own input, and a copy goes over another local rank's input."""
    rng = np.random.default_rng(n)
    mine, peer, child = (_random(rng, n) for _ in range(3))
    want = _numpy_sum([mine, peer, child], 4.0)
    _kernels.sum_into(mine, [mine, peer, child], [peer], 4.0)
    assert mine.tobytes() == want.tobytes()
    assert peer.tobytes() == want.tobytes()


def test_special_values_follow_ieee() -> None:
    a = np.array([np.inf, -np.inf, np.nan, 3.0e38, -0.0, 1.0], dtype=np.float32)
    b = np.array([1.0, np.inf, 1.0, 3.0e38, -0.0, -1.0], dtype=np.float32)
    out = np.empty_like(a)
    with np.errstate(all="ignore"):
        want = np.add(a, b)
    _kernels.sum_into(out, [a, b], [], 0.0)
    assert out.tobytes() == want.tobytes()  # inf, nan, nan, inf, -0.0, 0.0


def test_a_slice_of_a_larger_buffer_leaves_the_rest_alone() -> None:
    base = np.zeros(10_000, dtype=np.float32)
    ones = np.ones(5_000, dtype=np.float32)
    _kernels.sum_into(base[2_000:7_000], [ones, ones], [], 0.0)
    assert (base[2_000:7_000] == 2.0).all()
    assert not base[:2_000].any() and not base[7_000:].any()


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: (np.ones(4, np.float32), [np.ones(5, np.float32)], []), ValueError, "lengths differ"),
        (lambda: (np.ones(4, np.float32), [np.ones(4, np.float64)], []), TypeError, "float32"),
        (lambda: (np.ones(4, np.float32), [np.ones(8, np.float32)[::2]], []), TypeError, "C-contiguous"),
        (lambda: (np.ones(4, np.float32), [], []), ValueError, "1-64 sources"),
        (lambda: (np.ones(4, np.float32), [np.ones(4, np.float32)] * 65, []), ValueError, "1-64 sources"),
        (lambda: (np.ones(4, np.float32), [np.ones(4, np.float32)], [b"xxxxxxxxxxxxxxxx"]), TypeError, "writable"),
        (lambda: (np.ones(4, np.float32), 3, []), TypeError, "not iterable"),
    ],
)
def test_bad_buffers_are_refused(make: object, error: type[Exception], message: str) -> None:
    out, sources, copies = make()  # type: ignore[operator]
    before = out.copy()
    with pytest.raises(error, match=message):
        _kernels.sum_into(out, sources, copies, 0.0)
    assert (out == before).all()


def test_partly_overlapping_buffers_are_refused() -> None:
    buf = np.arange(10, dtype=np.float32)
    before = buf.copy()
    with pytest.raises(ValueError, match="overlap"):
        _kernels.sum_into(buf[1:9], [buf[0:8], buf[2:10]], [], 0.0)
    with pytest.raises(ValueError, match="overlap"):
        _kernels.sum_into(np.zeros(8, np.float32), [buf[0:8]], [buf[1:9]], 0.0)
    assert buf.tobytes() == before.tobytes()


def test_read_only_out_is_refused() -> None:
    out = np.ones(4, dtype=np.float32)
    out.flags.writeable = False
    with pytest.raises(TypeError, match="writable"):
        _kernels.sum_into(out, [np.ones(4, np.float32)], [], 0.0)


@pytest.mark.parametrize("num_sources", [1, 2, 3, 4, 5])
def test_out_may_be_any_of_the_sources(num_sources: int) -> None:
    """In place at every position, the fourth and fifth included (summed in a scratch block first)."""
    rng = np.random.default_rng(num_sources)
    for position in range(num_sources):
        sources = [_random(rng, 3 * 4096 + 5) for _ in range(num_sources)]
        want = _numpy_sum(sources, 3.0)
        copy = np.zeros_like(want)
        _kernels.sum_into(sources[position], sources, [copy, sources[position]], 3.0)
        assert sources[position].tobytes() == want.tobytes(), f"out at position {position}"
        assert copy.tobytes() == want.tobytes()


def test_unaligned_and_foreign_endian_buffers_are_refused() -> None:
    raw = np.zeros(4 * 9, dtype=np.uint8)
    unaligned = raw[1:33].view(np.float32)  # 8 floats starting one byte past the array's start
    assert not unaligned.flags.aligned
    ones = np.ones(8, dtype=np.float32)
    with pytest.raises(TypeError, match="aligned"):
        _kernels.sum_into(unaligned, [ones], [], 0.0)
    with pytest.raises(TypeError, match="native float32"):
        _kernels.sum_into(np.ones(8, np.float32), [ones.astype(">f4")], [], 0.0)
    assert not raw.any()


def test_a_refused_buffer_names_the_original_error() -> None:
    with pytest.raises(TypeError, match="C-contiguous") as info:
        _kernels.sum_into(np.ones(4, np.float32), [np.ones(8, np.float32)[::2]], [], 0.0)
    assert info.value.__cause__ is not None


def test_more_than_64_copies_are_refused() -> None:
    copies = [np.zeros(2, np.float32) for _ in range(65)]
    with pytest.raises(ValueError, match="at most 64 copies"):
        _kernels.sum_into(np.zeros(2, np.float32), [np.ones(2, np.float32)], copies, 0.0)
    assert not any(c.any() for c in copies)


@pytest.mark.parametrize("num_peers", [1, 2, 3])
@pytest.mark.parametrize("num_children", [1, 2])
@pytest.mark.parametrize("registered", [True, False])
def test_a_roots_chunk_through_the_kernel_is_the_numpy_blocks_bit_for_bit(
    num_peers: int, num_children: int, registered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline's use of the kernel: the same operands, in the same order, as its numpy blocks. Registered:
    the result is also written over the other local ranks' inputs (their buffers); else into other arrays."""
    calls: list[int] = []
    kernel = _kernels.sum_into

    def counted(*args: object) -> None:
        calls.append(1)
        kernel(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_kernels, "sum_into", counted)
    n, c0, c1 = 200_003, 1_000, 190_001  # several numpy blocks and a tail, inside the buffer
    rng = np.random.default_rng([num_peers, num_children, registered])
    data = [_random(rng, n) for _ in range(1 + num_peers)]
    children = [_random(rng, c1 - c0) for _ in range(num_children)]
    results = []
    for via_kernel in (True, False):
        mine, *peers = (a.copy() for a in data)
        others = peers if registered else [np.zeros(n, np.float32) for _ in peers]
        job = TreeJob(
            dtype=DType.F32,
            wire=DType.F32,
            op=ReduceOp.AVG,
            world_size=7,
            mine=mine,
            res=mine,
            peers=peers,
            distribute_to=others,
            span=(0, n),
        )
        fetched = np.zeros(c1 - c0, np.float32)
        if via_kernel:
            TreeEngine._root_chunk(job, c0, c1, children, fetched, combine_fn(ReduceOp.AVG), Counters())
        else:
            local = [mine[c0:c1], *(p[c0:c1] for p in peers)]
            copies = [o[c0:c1] for o in others]
            TreeEngine._root_blocks(
                job, c0, c1, mine[c0:c1], local, children, copies, fetched, combine_fn(ReduceOp.AVG)
            )
        results.append([mine.tobytes(), *(o.tobytes() for o in others)])
    assert calls == [1]  # the chunk went through the kernel, in one call
    assert results[0] == results[1]
    want = _numpy_sum([data[0][c0:c1], *(d[c0:c1] for d in data[1:]), *children], 7.0)
    assert np.frombuffer(results[0][0], np.float32)[c0:c1].tobytes() == want.tobytes()
