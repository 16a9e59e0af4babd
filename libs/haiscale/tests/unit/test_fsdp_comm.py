"""haiscale FSDP's registered-buffer collectives (``HFReduceComm``) over a fake hfreduce group: which buffer each
collective uses depends on the sequence of collectives only, never on when they completed or were waited for."""

from __future__ import annotations

from typing import Any

import torch

from haiscale.fsdp.comm import HFReduceComm, Pending

BLOCK, ROOT = 8, 4  # two unit sizes (elements of the flat, padded buffers) at world size 2


class FakeWork:
    """An hfreduce ``Work`` that completes when told to (or when waited for)."""

    def __init__(self) -> None:
        self.completed = False

    def wait(self) -> None:
        self.completed = True

    def is_completed(self) -> bool:
        return self.completed


class FakeGroup:
    """Registered buffers are plain tensors; an allreduce leaves the buffer as it is (one contributor)."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []
        self.issued: list[tuple[str, int, int]] = []  # (op, elements, registered buffer index): hfreduce's check
        self.works: list[FakeWork] = []

    def alloc(self, numel: int, dtype: str, *, as_torch: bool) -> torch.Tensor:
        assert dtype == "float32" and as_torch
        self.buffers.append(torch.zeros(numel))
        return self.buffers[-1]

    def allreduce_async(self, buf: torch.Tensor, op: str) -> FakeWork:
        index = next(i for i, b in enumerate(self.buffers) if b.data_ptr() == buf.data_ptr())
        self.issued.append((op, buf.numel(), index))
        self.works.append(FakeWork())
        return self.works[-1]

    def allgather_registered_async(self, buf: torch.Tensor, out: torch.Tensor | None = None) -> FakeWork:
        """The gathered blocks are the buffer's (one contributor), in ``out`` when given."""
        if out is not None:
            out.copy_(buf)
        return self.allreduce_async(buf, "allgather")

    def reduce_scatter_registered_async(self, buf: torch.Tensor, out: torch.Tensor | None, op: str) -> FakeWork:
        """This rank's block is the buffer's (one contributor), in ``out`` when given (as rank 0)."""
        if out is not None:
            out.copy_(buf[: out.numel()])
        return self.allreduce_async(buf, op)


class FakeShared:
    def __init__(self) -> None:
        self.group = FakeGroup()
        self.released = False

    def release(self) -> None:
        self.released = True


def ones(flat: torch.Tensor) -> None:
    """A gradient of ones, written into the buffer the reduce-scatter sends from."""
    flat.fill_(1.0)


def make_comm(rank: int) -> tuple[HFReduceComm, FakeGroup]:
    shared: Any = FakeShared()
    comm = HFReduceComm(shared, rank, 2, [(BLOCK, torch.float32), (ROOT, torch.float32), (BLOCK, torch.float32)])
    return comm, shared.group


def first_backward_with_step_in_backward(rank: int, *, late: bool) -> list[tuple[str, int, int]]:
    """The collectives of a first backward with ``step_in_backward`` (nothing to prefetch yet: each block is
    gathered when its backward starts), as one rank issues them. ``late``: this rank runs behind its peer, so
    each reduce-scatter has completed when it checks (``done()``) and it takes the result at once; the other
    rank finds them in flight and takes them at the end of backward."""
    comm, group = make_comm(rank)
    shard = torch.full((BLOCK // 2,), float(rank + 1))
    pending: list[Pending] = []
    for _block in range(3):
        comm.all_gather(torch.empty(BLOCK), shard).wait()  # the block's pre-backward hook
        pending.append(comm.reduce_scatter_mean(torch.empty(BLOCK // 2), ones, BLOCK))  # its gradient
        if late:
            group.works[-1].completed = True  # the peer issued it long ago: done when this rank looks
        if pending[-1].done():
            pending.pop().wait()  # _drain(block=False): step this unit's optimizer now
    pending.append(comm.reduce_scatter_mean(torch.empty(ROOT // 2), ones, ROOT))  # the root's gradient
    for p in pending:
        p.wait()
    assert comm.in_flight() == 0
    return group.issued


def test_a_collective_uses_the_same_registered_buffer_on_every_rank_whatever_the_timing() -> None:
    early = first_backward_with_step_in_backward(0, late=False)
    late = first_backward_with_step_in_backward(1, late=True)
    assert [op for op, _, _ in early] == ["allgather", "avg"] * 3 + ["avg"]
    # hfreduce's node barrier refuses a collective started on different buffers ("local ranks called different
    # collectives at once"): a pool that handed out the buffer given back last gave the late rank's second
    # gather the first reduce-scatter's buffer, the early rank's another one
    assert early == late
    # the root's three buffers (sizes in ascending order: indices 0-2), then the blocks' (3-5), each in turn
    assert [index for _, _, index in early] == [3, 4, 5, 3, 4, 5, 0]


def test_a_buffer_is_reused_only_once_its_previous_collective_is_finished() -> None:
    comm, group = make_comm(0)
    outs = [torch.empty(BLOCK) for _ in range(4)]
    started = [comm.all_gather(out, torch.full((BLOCK // 2,), float(i + 1))) for i, out in enumerate(outs)]
    # depth 3: the fourth gather takes the first one's buffer, so the first was finished (copied out) first
    assert comm.slot_of(started[0]) is None and comm.slot_of(started[3]) == (1, 0)
    assert group.works[0].completed and not group.works[1].completed
    assert outs[0].tolist() == [1.0] * 4 + [0.0] * 4  # rank 0's shard at its place (the peer's block: zeros here)
    for p in started[1:]:
        p.wait()
    assert [out[:4].tolist() for out in outs] == [[float(i + 1)] * 4 for i in range(4)]
    assert comm.in_flight() == 0
    comm.close()
    assert comm.registered_bytes() == 3 * (BLOCK + ROOT) * 4  # 3 buffers of each size, float32
