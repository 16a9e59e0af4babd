"""Shared-memory segments as anonymous memfds, which the kernel frees with the last process mapping them.

Nothing appears in /dev/shm, and a segment is freed when the last process mapping it exits, even after SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

_PAGE_BYTES = mmap.PAGESIZE
_THP = Path("/sys/kernel/mm/transparent_hugepage")
# Linux constants the mmap module of Python 3.11 lacks
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_MADV_COLLAPSE = 25  # Linux >= 6.1
_MAP_FIXED = 0x10
_MAP_NORESERVE = 0x4000
_MAP_FAILED = ctypes.c_void_p(-1).value
# ctypes calls release the GIL (a collapse takes milliseconds per MiB)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _pmd_bytes() -> int:
    """The size of a PMD-mapped huge page (2 MiB with 4 KiB base pages)."""
    try:
        return int((_THP / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 2 << 20


_HUGE_BYTES = _pmd_bytes()


def huge_pages(shared: bool = True) -> str:
    """The kernel's policy for transparent huge pages in shared memory (``always``, ``advise``, ``never``...).

    With ``shared=False``, its policy for private memory (``always``, ``madvise``, ``never``), or ``unknown``
    where the kernel does not say.

    Segments ask for them (``MADV_HUGEPAGE``), so under ``advise`` or ``always`` they are mapped with 2 MiB
    pages: fewer TLB misses in every copy, add and socket transfer of a registered buffer (a registered 2x2
    allreduce took 3-5 % less CPU here with ``advise``). Many kernels ship ``never``; the setting is the
    administrator's (``/sys/kernel/mm/transparent_hugepage/shmem_enabled``). The creator of a registered buffer
    also collapses it into huge pages (``MADV_COLLAPSE``), which kernels from 6.1 on grant under ``never`` as well
    (6.18 here); only ``deny`` refuses (see ``Segment.create``).
    """
    try:
        text = (_THP / ("shmem_enabled" if shared else "enabled")).read_text()
    except OSError:
        return "unknown"
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else text.strip()


class Segment:
    """One mapped shared-memory segment. Create it in one process, pass ``fd`` to the others."""

    def __init__(self, fd: int, nbytes: int, *, owns_fd: bool) -> None:
        self.nbytes = nbytes
        self._fd: int | None = fd if owns_fd else None
        self._map: mmap.mmap | None = None
        self._offset = 0  # where the segment starts in ``_map``
        self._aligned = False  # mapped at a huge-page boundary, as huge pages need
        if nbytes >= _HUGE_BYTES:
            try:
                self._map, self._offset = _map_huge_aligned(fd, nbytes)
                self._aligned = True
            except OSError as exc:
                logger.debug("shared segment mapped where the kernel puts it (no huge pages): %s", exc)
        if self._map is None:  # mmap needs a non-zero length; a zero-byte segment maps one page it never uses
            self._map = mmap.mmap(fd, max(nbytes, 1), mmap.MAP_SHARED)
        self._addr = ctypes.addressof(ctypes.c_char.from_buffer(self._map)) + self._offset  # export ends here
        with contextlib.suppress(OSError):  # granted where the kernel allows shared huge pages (see huge_pages)
            self._map.madvise(mmap.MADV_HUGEPAGE, self._offset, max(nbytes, 1))

    @classmethod
    def create(cls, name: str, nbytes: int, *, huge: bool = False) -> Segment:
        """A new zero-filled segment of ``nbytes``, pre-faulted in this process.

        With ``huge``, its whole huge pages are also collapsed into huge pages (``collapse``), so the processes
        that attach it later map those as they fault it in: worth it for a buffer reduced many times (registered
        buffers), not for scratch that is remapped as it grows (a collapse costs about 2.5 ms per MiB once).
        """
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(nbytes, 1))
            seg = cls(fd, nbytes, owns_fd=True)
        except BaseException:
            os.close(fd)
            raise
        seg.prefault()
        if huge:
            seg.collapse()
        return seg

    @classmethod
    def attach(cls, fd: int, nbytes: int) -> Segment:
        """Map a segment received from another process (the fd is closed once mapped)."""
        try:
            seg = cls(fd, nbytes, owns_fd=False)
        finally:
            os.close(fd)
        seg.prefault()
        return seg

    @property
    def fd(self) -> int:
        """The creator's fd, to pass to the other processes (``socket.send_fds``).

        Raises:
            ValueError: the fd was already released (``release_fd``) or the segment was attached, not created.
        """
        if self._fd is None:
            raise ValueError("this segment's fd was already released")
        return self._fd

    def release_fd(self) -> None:
        """Close the creator's fd once every peer has mapped the segment; the mapping stays valid."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def prefault(self) -> None:
        """Map every page writable now: a first touch in the hot loop costs 4x a plain copy."""
        if self._map is None or self.nbytes == 0:
            return
        if _libc.madvise(self._addr, self.nbytes, _MADV_POPULATE_WRITE) != 0:  # Linux < 5.14
            view = self.array(np.uint8, self.nbytes)[::_PAGE_BYTES]
            view[:] = view  # rewrite the same bytes: faults pages in without changing data

    def collapse(self) -> bool:
        """Move the segment's pages into huge pages (the data is kept); return whether the kernel did.

        Only the whole huge pages it spans move. A registered 2x2 allreduce of 64 MiB took about 3 % less machine
        time with them (bench/results/hfreduce_allreduce.md). Needs Linux >= 6.1 and a shared-memory policy the
        kernel lets collapse override (``never`` here; not ``deny``), a segment of at least one huge page, and free
        huge pages; else the pages stay as they are.
        """
        if self._map is None or not self._aligned:
            return False
        if _libc.madvise(self._addr, self.nbytes, _MADV_COLLAPSE) != 0:
            err = ctypes.get_errno()
            logger.debug("shared segment not (wholly) collapsed into huge pages: %s", os.strerror(err))
            return False
        return True

    def array(self, dtype: npt.DTypeLike, count: int, offset_bytes: int = 0) -> npt.NDArray[Any]:
        """A numpy view of ``count`` items of ``dtype`` starting at ``offset_bytes``."""
        if self._map is None:
            raise ValueError("segment is closed")
        if offset_bytes < 0 or count < 0 or offset_bytes + count * np.dtype(dtype).itemsize > max(self.nbytes, 1):
            raise ValueError(f"{count} x {np.dtype(dtype)} at byte {offset_bytes} is past a {self.nbytes}-byte segment")
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=self._offset + offset_bytes)

    def close(self) -> None:
        """Unmap (deferred to garbage collection while numpy views of the segment are alive)."""
        self.release_fd()
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None


def _map_huge_aligned(fd: int, nbytes: int) -> tuple[mmap.mmap, int]:
    """Map ``nbytes`` of ``fd`` at a huge-page-aligned address, as huge pages need.

    The address and the file offset must agree modulo the huge-page size, and the kernel places shared memory
    anywhere under ``never``.

    Returns an anonymous reservation one huge page longer than ``nbytes``, with the segment mapped over part of it
    (``MAP_FIXED``), and the segment's offset in it. Closing the reservation unmaps both, so numpy views keep the
    whole mapping alive as they keep any ``mmap``.
    """
    owner = mmap.mmap(-1, nbytes + _HUGE_BYTES, mmap.MAP_PRIVATE | _MAP_NORESERVE)
    try:
        base = ctypes.addressof(ctypes.c_char.from_buffer(owner))  # the temporary export ends with the statement
        offset = -base % _HUGE_BYTES
        prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_FIXED
        got = _libc.mmap(base + offset, nbytes, prot, flags, fd, 0)
        if got is None or got == _MAP_FAILED or got != base + offset:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap at a huge-page boundary: {os.strerror(err)}")
    except BaseException:
        owner.close()
        raise
    return owner, offset
