"""Which gradient goes into which bucket, and where: a pure plan, the same on every rank for the same model."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

DEFAULT_BUCKET_CAP_MB = 25.0


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    """What the plan needs to know of one parameter.

    ``kind`` groups parameters that may share a bucket: the same dtype on the same device.
    """

    numel: int
    itemsize: int
    kind: str


@dataclasses.dataclass(frozen=True)
class Slot:
    """Parameter ``param`` occupies elements ``[offset, offset + numel)`` of its bucket."""

    param: int
    offset: int
    numel: int


@dataclasses.dataclass(frozen=True)
class BucketSpec:
    """One bucket: its parameters' slots, in the order they were placed, and its size in elements."""

    index: int
    kind: str
    itemsize: int
    slots: tuple[Slot, ...]

    @property
    def numel(self) -> int:
        """The bucket's size in elements: its slots end to end."""
        return sum(s.numel for s in self.slots)

    @property
    def nbytes(self) -> int:
        """The bucket's size in bytes."""
        return self.numel * self.itemsize


def plan_buckets(params: Sequence[ParamInfo], cap_bytes: int) -> list[BucketSpec]:
    """Place parameters into buckets of at most ``cap_bytes`` (a larger parameter gets a bucket of its own).

    Parameters are taken in reverse order, as backward produces gradients roughly from the last layer to the
    first (torch DDP does the same), so the first bucket fills first. Parameters of different kinds never
    share a bucket; each kind fills its own open bucket. Buckets are numbered in the order they were opened,
    which is the order every rank launches their reductions in.

    Raises:
        ValueError: ``cap_bytes`` is not positive.
    """
    if cap_bytes <= 0:
        raise ValueError(f"bucket_cap_mb must be positive, got {cap_bytes} bytes")
    opened: list[list[int]] = []  # parameter indices per bucket, by opening order
    open_by_kind: dict[str, int] = {}  # kind -> its open bucket's position in ``opened``
    bytes_by_bucket: list[int] = []
    for i in reversed(range(len(params))):
        info = params[i]
        size = info.numel * info.itemsize
        pos = open_by_kind.get(info.kind)
        if pos is None or (bytes_by_bucket[pos] > 0 and bytes_by_bucket[pos] + size > cap_bytes):
            pos = len(opened)
            opened.append([])
            bytes_by_bucket.append(0)
            open_by_kind[info.kind] = pos
        opened[pos].append(i)
        bytes_by_bucket[pos] += size
    return [_spec(index, members, params) for index, members in enumerate(opened)]


def _spec(index: int, members: list[int], params: Sequence[ParamInfo]) -> BucketSpec:
    slots, offset = [], 0
    for i in members:
        slots.append(Slot(param=i, offset=offset, numel=params[i].numel))
        offset += params[i].numel
    first = params[members[0]]
    return BucketSpec(index=index, kind=first.kind, itemsize=first.itemsize, slots=tuple(slots))


def cap_bytes_of(bucket_cap_mb: float | None) -> int:
    """Convert torch DDP's ``bucket_cap_mb`` (MiB, default 25) to bytes."""
    mb = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else float(bucket_cap_mb)
    return int(mb * (1 << 20))


class LaunchOrder:
    """Which buckets may start reducing, as gradients arrive during one backward.

    A bucket is full once each of its parameters has its gradient. Buckets are launched strictly in index
    order (a full bucket waits for the buckets before it): every rank must issue its collectives in the same
    order, whatever order its gradients arrive in.
    """

    def __init__(self, buckets: Sequence[BucketSpec], num_params: int) -> None:
        self._bucket_of = [-1] * num_params
        for b in buckets:
            for s in b.slots:
                self._bucket_of[s.param] = b.index
        self._sizes = [len(b.slots) for b in buckets]
        self.reset()

    def reset(self) -> None:
        """Start a new backward: nothing ready, nothing launched."""
        self._pending = list(self._sizes)
        self._ready = [False] * len(self._bucket_of)
        self._next = 0

    @property
    def launched(self) -> int:
        """How many buckets have been launched (buckets ``0 .. launched - 1``)."""
        return self._next

    def is_ready(self, param: int) -> bool:
        """Whether ``param``'s gradient has arrived in this backward."""
        return self._ready[param]

    def mark_ready(self, param: int) -> list[int]:
        """Record ``param``'s gradient; return the buckets to launch now, in order.

        Raises:
            RuntimeError: ``param`` is already ready in this backward.
        """
        if self._ready[param]:
            raise RuntimeError("ready twice")
        self._ready[param] = True
        self._pending[self._bucket_of[param]] -= 1
        return self._take_full()

    def unready(self) -> list[int]:
        """Parameters that have no gradient yet in this backward."""
        return [i for i, r in enumerate(self._ready) if not r and self._bucket_of[i] >= 0]

    def _take_full(self) -> list[int]:
        start = self._next
        while self._next < len(self._pending) and self._pending[self._next] == 0:
            self._next += 1
        return list(range(start, self._next))
