"""haiscale FSDP's pure parts: the flat layout of a unit over the ranks, and which modules become units."""

from __future__ import annotations

import pytest
import torch

from haiscale.fsdp import ModuleWrapPolicy, SizeWrapPolicy, layout_of, plan_units


def test_shards_cover_every_parameter_once_whatever_the_world_size() -> None:
    numels = [5, 1, 12, 0, 7]
    for world in (1, 2, 3, 4, 7, 40):
        layout = layout_of(numels, world)
        assert layout.padded == layout.shard_numel * world >= layout.total == 25
        covered = {i: [0] * n for i, n in enumerate(numels)}
        for rank in range(world):
            pieces = layout.pieces(rank)
            assert [p.param for p in pieces] == list(range(len(numels)))  # every rank names every parameter
            for p in pieces:
                assert p.shard_offset >= 0 and p.shard_offset + p.numel <= layout.shard_numel
                # the piece is where the flat buffer says: rank * S + shard_offset == param start + param_offset
                if p.numel:
                    start = layout.offsets()[p.param]
                    assert rank * layout.shard_numel + p.shard_offset == start + p.param_offset
                for k in range(p.param_offset, p.param_offset + p.numel):
                    covered[p.param][k] += 1
        assert all(c == [1] * len(c) for c in covered.values()), (world, covered)


def test_layout_refuses_bad_sizes() -> None:
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        layout_of([3], 0)
    with pytest.raises(ValueError, match="must not be negative"):
        layout_of([3, -1], 2)
    with pytest.raises(ValueError, match=r"rank 2 not in \[0, 2\)"):
        layout_of([3], 2).pieces(2)


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = torch.nn.Linear(width, width)
        self.b = torch.nn.Linear(width, width)


def test_units_by_class_by_size_children_before_the_root() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), Block(8), Block(8), torch.nn.Linear(8, 2))
    by_class = plan_units(model, ModuleWrapPolicy([Block]))
    assert by_class == [model[1], model[2], model]
    # 72 elements per Linear(8, 8): each Linear of a block reaches 70, a block's own parameters are then taken
    by_size = plan_units(model, SizeWrapPolicy(70))
    assert by_size == [model[1].a, model[1].b, model[2].a, model[2].b, model]
    assert plan_units(model, None) == [model]
    shared = torch.nn.Sequential(model[1], model[1])  # one module reached twice is one unit
    assert plan_units(shared, ModuleWrapPolicy([Block])) == [model[1], shared]
