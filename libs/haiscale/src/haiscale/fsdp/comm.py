"""The two collectives FSDP needs, asynchronous, on any torch.distributed process group."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist


@dataclasses.dataclass
class Pending:
    """An asynchronous collective and the tensors it uses, kept alive until ``wait()`` returns."""

    work: Any  # torch.distributed Work, or None when nothing was sent (a world of one)
    keep: tuple[torch.Tensor, ...]
    what: str = "collective"

    def wait(self) -> None:
        """Block until done; raise the collective's error (e.g. hfreduce's naming a dead rank)."""
        if self.work is not None:
            self.work.wait()
            # hfreduce's torch backend fails a collective through its future only (work.wait() returns as if
            # it succeeded); gloo's reduce-scatter has no future (its wait() raises)
            try:
                future = self.work.get_future()
            except RuntimeError:
                future = None
            if future is not None:
                try:
                    future.wait()
                except RuntimeError as exc:
                    raise RuntimeError(f"haiscale FSDP: {self.what} failed: {_cause(exc)}") from exc
        self.keep = ()

    def done(self) -> bool:
        return self.work is None or bool(self.work.is_completed())


class Comm:
    """``all_gather`` and ``reduce_scatter`` of flat tensors over ``pg``, started without waiting.

    On backend ``hfreduce`` each runs on hfreduce's collective thread (ring over the ranks' links); on gloo on
    gloo's threads; on nccl on its stream (``wait()`` makes the caller's stream wait for it). Collectives are
    started in the same order on every rank: FSDP's hooks run in the same order everywhere for the same graph.
    """

    def __init__(self, pg: Any) -> None:
        self.pg = pg
        self.rank = dist.get_rank(pg)
        self.world_size = dist.get_world_size(pg)
        self.src = dist.get_global_rank(pg, 0)

    def all_gather(self, out: torch.Tensor, shard: torch.Tensor) -> Pending:
        """``out`` (world size x ``shard``) receives every rank's ``shard`` in rank order."""
        if self.world_size == 1:
            with torch.no_grad():
                out.copy_(shard)
            return Pending(None, ())
        work = dist.all_gather_single(out, shard, group=self.pg, async_op=True)
        return Pending(work, (out, shard), "all-gather")

    def reduce_scatter(self, out: torch.Tensor, full: torch.Tensor) -> Pending:
        """``out`` receives block ``rank`` of the sum of every rank's ``full``."""
        if self.world_size == 1:
            with torch.no_grad():
                out.copy_(full)
            return Pending(None, ())
        work = dist.reduce_scatter_single(out, full, op=dist.ReduceOp.SUM, group=self.pg, async_op=True)
        return Pending(work, (out, full), "reduce-scatter")

    def broadcast(self, t: torch.Tensor) -> None:
        """Give every rank group rank 0's ``t``."""
        if self.world_size > 1:
            dist.broadcast(t, src=self.src, group=self.pg)


def _cause(exc: BaseException) -> str:
    """The collective's own message, without the wrapping torch adds around a failed future's callback."""
    text = str(exc).split("Got the following error when running the callback: ", 1)[-1]
    return text.split("\n\nAt:", 1)[0].strip()
