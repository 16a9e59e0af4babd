"""``SpareMemory``: a freed gathered buffer's memory comes back at its unit's next gather, under the same storage."""

from __future__ import annotations

import torch

from haiscale.fsdp.memory import SpareMemory


def test_a_buffer_emptied_and_filled_again_gets_its_memory_back_and_its_views_see_it() -> None:
    spare = SpareMemory()
    buffer = torch.empty(0)
    storage = buffer.untyped_storage()
    spare.fill(storage, 64 * 4)  # the first gather allocates
    full = torch.empty(0).set_(storage, 0, (64,), (1,))
    view = full[8:16].view(2, 4)  # what autograd saves: a view of the buffer
    full.copy_(torch.arange(64.0))
    first = storage.data_ptr()
    spare.empty(storage)
    assert storage.nbytes() == 0 and spare.nbytes() == 64 * 4  # the unit holds nothing, the memory is kept
    spare.fill(storage, 64 * 4)
    assert storage.data_ptr() == first and spare.nbytes() == 0  # the same memory, no new allocation
    full.fill_(1.0)  # the next gather writes the buffer
    assert view.tolist() == [[1.0] * 4] * 2  # the saved view sees it
    spare.empty(storage)
    spare.release()
    assert spare.nbytes() == 0 and storage.nbytes() == 0


def test_buffers_of_other_sizes_do_not_take_each_others_memory() -> None:
    spare = SpareMemory()
    small, large = torch.empty(0).untyped_storage(), torch.empty(0).untyped_storage()
    spare.fill(small, 16)
    spare.empty(small)
    spare.fill(large, 4096)
    assert large.nbytes() == 4096 and spare.nbytes() == 16  # a new allocation; the small spare stays
    spare.fill(small, 16)
    assert small.nbytes() == 16 and spare.nbytes() == 0
