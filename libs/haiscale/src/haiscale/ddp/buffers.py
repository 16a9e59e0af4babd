"""Broadcasting a module's buffers (any dtype) from one rank through hfreduce, packed as bytes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hfreduce import Group


class BufferBroadcaster:
    """Copies ``buffers`` from rank ``src`` to every rank in one broadcast.

    hfreduce moves float32/float16/bfloat16 data; a broadcast only copies bytes, so the buffers (int64 step
    counters, bool masks, floats) are packed as raw bytes into one float32-typed tensor, sent, and unpacked
    bit for bit on the receiving ranks.
    """

    def __init__(self, group: Group, buffers: Sequence[torch.Tensor]) -> None:
        self.group = group
        self.buffers = list(buffers)
        self._sizes = [b.numel() * b.element_size() for b in self.buffers]
        total = sum(self._sizes)
        device = self.buffers[0].device if self.buffers else torch.device("cpu")
        self._packed = torch.zeros((total + 3) // 4, dtype=torch.float32, device=device)
        self._bytes = self._packed.view(torch.uint8)

    def broadcast(self, src: int) -> None:
        """Every rank's buffers take ``src``'s values (all ranks call this together)."""
        if not self.buffers:
            return
        with torch.no_grad():
            sender = self.group.rank == src
            if sender:
                self._pack()
            self.group.broadcast(self._packed, src=src)
            if not sender:
                self._unpack()

    def _pack(self) -> None:
        offset = 0
        for buf, size in zip(self.buffers, self._sizes, strict=True):
            self._bytes[offset : offset + size].copy_(_as_bytes(buf))
            offset += size

    def _unpack(self) -> None:
        offset = 0
        for buf, size in zip(self.buffers, self._sizes, strict=True):
            src = self._bytes[offset : offset + size]
            if buf.is_contiguous():
                _as_bytes(buf).copy_(src)
            else:
                buf.copy_(src.clone().view(buf.dtype).view(buf.shape))
            offset += size


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(-1).view(torch.uint8)
