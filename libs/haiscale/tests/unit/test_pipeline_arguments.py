"""haiscale.pipeline's pure parts: stage bounds and partition, group layout, schedules, batch splitting, the
activation header; bad arguments refused with the reason."""

from __future__ import annotations

import pytest
import torch

from haiscale.pipeline import PipeDream, SequentialModel, partition, stage_bounds, subgroup_ranks
from haiscale.pipeline.engine import split_batch
from haiscale.pipeline.schedule import Action, gpipe, ideal_bubble, one_f_one_b, peak_in_flight
from haiscale.pipeline.transport import decode_header, encode_header

pytestmark = pytest.mark.unit


def mlp() -> torch.nn.Sequential:
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])


def test_partition_follows_balance_and_keeps_the_layer_names() -> None:
    model = mlp()
    stages = [partition(model, r, 3, balance=[2, 2, 1]) for r in range(3)]
    assert [list(s.state_dict()) for s in stages] == [
        ["0.weight", "0.bias", "1.weight", "1.bias"],
        ["2.weight", "2.bias", "3.weight", "3.bias"],
        ["4.weight", "4.bias"],
    ]
    assert stages[2][0] is model[4]  # the layers themselves, not copies
    x = torch.randn(2, 4)
    assert torch.equal(stages[2](stages[1](stages[0](x))), model(x))
    assert stage_bounds(5, 2) == [(0, 3), (3, 5)]  # without balance: as even as possible, the first stages first


@pytest.mark.parametrize(
    ("balance", "message"),
    [
        ([2, 2], r"balance \[2, 2\] sums to 4 layers, the model has 5"),
        ([2, 2, 1], r"balance \[2, 2, 1\] has 3 entries, there are 2 stages"),
        ([5, 0], r"every stage needs at least one layer"),
    ],
)
def test_a_balance_that_does_not_fit_is_refused(balance: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        partition(mlp(), 0, 2, balance=balance)


def test_other_bad_partitions_are_refused() -> None:
    with pytest.raises(ValueError, match=r"pp_rank 2 not in \[0, 2\)"):
        partition(mlp(), 2, 2)
    with pytest.raises(ValueError, match="cannot cut 5 layers into 6 stages"):
        partition(mlp(), 0, 6)
    with pytest.raises(TypeError, match=r"partition cuts a torch\.nn\.Sequential.*got Linear"):
        partition(torch.nn.Linear(2, 2), 0, 1)


def test_sequential_model_passes_tuples_as_arguments() -> None:
    class Pair(torch.nn.Module):
        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * scale, scale

    model = SequentialModel(Pair(), Pair())
    x, scale = model(torch.ones(2), torch.full((2,), 3.0))
    assert x.tolist() == [9.0, 9.0] and scale.tolist() == [3.0, 3.0]


def test_subgroups_are_stage_major() -> None:
    dp, pp = subgroup_ranks(8, 2)
    assert dp == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a stage's replicas: consecutive ranks (one node's)
    assert pp == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match="pp_size 3 must be at least 1 and divide the world size 8"):
        subgroup_ranks(8, 3)


def test_schedules_run_every_micro_batch_once_each_way() -> None:
    assert gpipe(3, 0, 2) == [
        Action("F", 0),
        Action("F", 1),
        Action("F", 2),
        Action("B", 2),
        Action("B", 1),
        Action("B", 0),
    ]
    assert one_f_one_b(4, 0, 2) == [
        Action("F", 0),
        Action("F", 1),
        Action("B", 0),
        Action("F", 2),
        Action("B", 1),
        Action("F", 3),
        Action("B", 2),
        Action("B", 3),
    ]
    for p in (1, 2, 4):
        for s in range(p):
            for m in (1, 3, 8):
                for actions in (gpipe(m, s, p), one_f_one_b(m, s, p)):
                    assert sorted((a.micro, a.kind) for a in actions) == sorted(
                        (i, k) for i in range(m) for k in ("F", "B")
                    )
                assert peak_in_flight(gpipe(m, s, p)) == m
                assert peak_in_flight(one_f_one_b(m, s, p)) == min(p - s, m)
    assert ideal_bubble(8, 4) == pytest.approx(3 / 11)
    with pytest.raises(ValueError, match=r"chunks .* must be at least 1, got 0"):
        gpipe(0, 0, 2)


def test_split_batch_refuses_batches_the_chunks_do_not_divide() -> None:
    parts = split_batch((torch.arange(6), torch.arange(12).view(6, 2)), 3, "input")
    assert [p[0].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="chunks=4 does not divide the input batch of 6 samples"):
        split_batch((torch.zeros(6),), 4, "input")
    with pytest.raises(ValueError, match=r"different batch sizes \[4, 6\]"):
        split_batch((torch.zeros(6), torch.zeros(4)), 2, "label")
    with pytest.raises(ValueError, match="no label tensor given"):
        split_batch((), 2, "label")
    with pytest.raises(TypeError, match="input 0 is list"):
        split_batch(([1, 2],), 2, "input")


def test_the_activation_header_round_trips_and_refuses_what_it_cannot_carry() -> None:
    tensors = [
        torch.zeros(2, 3, requires_grad=True),
        torch.zeros(4, dtype=torch.int64),
        torch.zeros((), dtype=torch.bool),
    ]
    assert decode_header(encode_header(tensors)) == [
        (torch.float32, True, (2, 3)),
        (torch.int64, False, (4,)),
        (torch.bool, False, ()),
    ]
    with pytest.raises(TypeError, match="item 0 is str"):
        encode_header(["x"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at most 16 tensors"):
        encode_header([torch.zeros(1)] * 17)


def test_pipeline_arguments_are_checked_before_any_communication() -> None:
    with pytest.raises(ValueError, match=r"chunks .* must be a positive int, got 0"):
        PipeDream(torch.nn.Linear(2, 2), 0)
    with pytest.raises(TypeError, match=r"runs a torch\.nn\.Module, got str"):
        PipeDream("model", 2)  # type: ignore[arg-type]
    torch_ddp = torch.nn.parallel.DistributedDataParallel.__new__(torch.nn.parallel.DistributedDataParallel)
    with pytest.raises(TypeError, match=r"wrap the stage in haiscale\.ddp\.DistributedDataParallel, not torch's"):
        PipeDream(torch_ddp, 2)
    with pytest.raises(RuntimeError, match=r"call init_process_group\(...\) first"):
        PipeDream(torch.nn.Linear(2, 2), 2)
