"""Where each parameter of a unit lives in its flat buffer, and which part of it each rank's shard holds."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Piece:
    """The part of one parameter that one rank's shard holds.

    Elements ``[param_offset, param_offset + numel)`` of parameter ``param`` (flattened) are elements
    ``[shard_offset, shard_offset + numel)`` of a rank's shard.
    """

    param: int
    param_offset: int
    shard_offset: int
    numel: int


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """A unit's parameters laid end to end in one flat buffer, padded to a multiple of the world size.

    Rank ``r`` holds elements ``[r * shard_numel, (r + 1) * shard_numel)`` of the padded buffer (ZeRO-3's flat
    partition), so an all-gather of the shards is the padded buffer and a reduce-scatter of a padded gradient
    gives each rank its shard's gradient.
    """

    numels: tuple[int, ...]
    world_size: int

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        if any(n < 0 for n in self.numels):
            raise ValueError(f"parameter sizes must not be negative: {list(self.numels)}")

    @property
    def total(self) -> int:
        """Elements of all parameters, without padding."""
        return sum(self.numels)

    @property
    def shard_numel(self) -> int:
        """Elements per rank (at least 1, so every rank's shard is a real tensor)."""
        return max(1, -(-self.total // self.world_size))

    @property
    def padded(self) -> int:
        """Elements of the gathered buffer: ``world_size * shard_numel``."""
        return self.shard_numel * self.world_size

    def offsets(self) -> list[int]:
        """Where each parameter starts in the flat buffer."""
        out, at = [], 0
        for n in self.numels:
            out.append(at)
            at += n
        return out

    def pieces(self, rank: int) -> list[Piece]:
        """The parts of every parameter that rank ``rank``'s shard holds, in parameter order.

        A parameter with no element in the shard still gets a piece of zero elements, so every rank names every
        parameter.

        Raises:
            ValueError: ``rank`` is not in ``[0, world_size)``.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} not in [0, {self.world_size})")
        lo, hi = rank * self.shard_numel, (rank + 1) * self.shard_numel
        pieces = []
        for i, (start, n) in enumerate(zip(self.offsets(), self.numels, strict=True)):
            a, b = max(lo, start), min(hi, start + n)
            pieces.append(Piece(i, a - start, a - lo, b - a) if b > a else Piece(i, 0, 0, 0))
        return pieces


def layout_of(numels: Sequence[int], world_size: int) -> FlatLayout:
    """The layout of parameters of ``numels`` elements over ``world_size`` ranks."""
    return FlatLayout(tuple(int(n) for n in numels), int(world_size))
