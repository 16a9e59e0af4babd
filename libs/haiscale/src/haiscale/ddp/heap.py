"""Freed memory kept in the process (glibc malloc), so the gradients autograd allocates every step do not page-fault."""

from __future__ import annotations

import ctypes
import functools
import logging

logger = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1  # the largest value mallopt takes: freed memory at the top of the heap stays


@functools.cache  # once per process (a second call from another thread would only set the same values again)
def keep_freed_memory() -> bool:
    """Make glibc malloc serve large blocks from its heap and keep what is freed there (process-wide, once).

    Every backward, autograd allocates each parameter's gradient afresh (the reducer copies it into its bucket and
    frees it; torch DDP copies it into its own bucket and keeps it until ``zero_grad()``). glibc serves a block
    above its mmap threshold (at most 32 MiB, the 4096 x 4096 weights of the benchmark's MLP are 64 MiB) with a
    new mapping and unmaps it when it is freed, so every step takes a page fault on each 4 KiB page of such
    gradients: at 2 ranks on that MLP, 49,000 faults per step and rank, about half of a step's wall time on
    these VMs. With mmap off (``M_MMAP_MAX`` 0) and the heap never trimmed (``M_TRIM_THRESHOLD``), a freed
    gradient's memory is taken again by the next one, already mapped. The process then keeps the most it held at
    once, as torch's caching allocator does with GPU memory. This applies to the whole process (torch DDP or any
    other code in it gains too) and lasts; threads' arenas still map blocks too large for them.

    Returns:
        Whether the setting is in force (False where the C library is not glibc).
    """
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        logger.info("haiscale DDP: not glibc; freed memory goes back to the system as the C library decides")
        return False
    done = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
    if not done:
        logger.warning("haiscale DDP: mallopt refused; gradients may be page-faulted in at every step")
    return done
