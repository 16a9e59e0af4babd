"""The memory of freed gathered buffers on the CPU, kept for the next gather of the same size."""

from __future__ import annotations

import collections
from typing import Any

import torch

# a private torch binding (UntypedStorage._swap_data_ptr_: two storages exchange their memory and sizes); without
# it, buffers are freed and allocated again with ``resize_`` as before
_CAN_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_")


class SpareMemory:
    """Moves a gathered buffer's memory out of its storage when the unit frees it, and back in at the next gather.

    A unit frees its gathered buffer by emptying its storage (the views autograd saved keep their shape and get
    the data back when the storage is filled again). On the CPU, ``resize_`` hands a buffer of megabytes back to
    malloc, which returns it to the system, so the next gather into it takes a page fault on every 4 KiB page (at
    4 ranks on the tiny GPT of the benchmark, 1,500-2,900 faults per step and rank, 10-15 % of its CPU). Here the
    memory moves, by swapping data pointers, into a spare storage kept until a unit of that size gathers again,
    when it swaps back: the unit's storage object is the same throughout, as with ``resize_``. What is kept is at
    most what was gathered at once at the peak (as torch's caching allocator keeps GPU memory); ``release()``
    gives it back. GPU buffers are resized as before: torch's caching allocator already reuses their memory, in
    stream order.
    """

    def __init__(self) -> None:
        self._spares: collections.defaultdict[int, list[torch.UntypedStorage]] = collections.defaultdict(list)

    def fill(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """Give the empty ``storage`` ``nbytes`` of memory: a spare of that size if there is one, else new."""
        spares = self._spares.get(nbytes) if storage.device.type == "cpu" else None
        if spares:
            _swap(storage, spares.pop())
        else:
            storage.resize_(nbytes)

    def empty(self, storage: torch.UntypedStorage) -> None:
        """Take ``storage``'s memory away (it keeps no byte), as a spare on the CPU."""
        if not _CAN_SWAP or storage.device.type != "cpu" or storage.nbytes() == 0:
            storage.resize_(0)
            return
        spare: torch.UntypedStorage = torch.empty(0, dtype=torch.uint8).untyped_storage()
        _swap(spare, storage)
        self._spares[spare.nbytes()].append(spare)

    def nbytes(self) -> int:
        """Bytes kept as spares."""
        return sum(s.nbytes() for spares in self._spares.values() for s in spares)

    def release(self) -> None:
        """Free every spare."""
        self._spares.clear()


def _swap(a: torch.UntypedStorage, b: torch.UntypedStorage) -> None:
    """Exchange the memory (data pointer and size) of two storages; tensors over them see the other's memory."""
    swap: Any = a._swap_data_ptr_  # type: ignore[attr-defined]  # private, not in torch's stubs
    swap(b)
