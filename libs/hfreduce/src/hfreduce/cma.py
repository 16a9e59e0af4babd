"""Cross-memory attach: copy between this process and another local rank's private memory.

``process_vm_readv``/``process_vm_writev`` make one kernel copy, with no shared staging buffer. The ctypes calls
release the GIL.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

import numpy as np

from hfreduce.reduction import Array
from hfreduce.transport import LinkError

# (pid, address): where a local rank's buffer is, as the local ranks exchange it at a node barrier
PID_ADDR = struct.Struct("!QQ")


class _IoVec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


def _load() -> tuple[object, object] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        read, write = libc.process_vm_readv, libc.process_vm_writev
    except (OSError, AttributeError):
        return None
    for fn in (read, write):
        fn.argtypes = (
            ctypes.c_int,
            ctypes.POINTER(_IoVec),
            ctypes.c_ulong,
            ctypes.POINTER(_IoVec),
            ctypes.c_ulong,
            ctypes.c_ulong,
        )
        fn.restype = ctypes.c_ssize_t
    return read, write


_FUNCS = _load()


def address(arr: Array) -> int:
    """Virtual address of the first byte of a contiguous array."""
    return int(arr.__array_interface__["data"][0])


class RemoteBuffer:
    """A contiguous buffer of ``dtype`` items at ``base`` in local rank process ``pid`` (global rank ``rank``)."""

    def __init__(self, *, pid: int, base: int, itemsize: int, rank: int) -> None:
        self.pid = pid
        self.base = base
        self.itemsize = itemsize
        self.rank = rank

    def read(self, start: int, out: Array) -> None:
        """Fill ``out`` with the remote items ``[start, start + len(out))``."""
        self._transfer(0, start, out)

    def write(self, start: int, data: Array) -> None:
        """Store ``data`` at the remote items ``[start, start + len(data))``."""
        self._transfer(1, start, data)

    def _transfer(self, which: int, start: int, local: Array) -> None:
        if _FUNCS is None:
            raise LinkError(self.rank, "closed", "process_vm_readv/writev is not available")
        fn = _FUNCS[which]
        total = local.nbytes
        done = 0
        local_iov, remote_iov = _IoVec(), _IoVec()
        while done < total:  # the kernel may stop early (e.g. at a signal); continue where it did
            local_iov.base, local_iov.len = address(local) + done, total - done
            remote_iov.base, remote_iov.len = self.base + start * self.itemsize + done, total - done
            got = fn(self.pid, ctypes.byref(local_iov), 1, ctypes.byref(remote_iov), 1, 0)  # type: ignore[operator]
            if got <= 0:
                err = ctypes.get_errno()
                raise LinkError(self.rank, "closed", f"cross-memory copy failed: {os.strerror(err or errno.EIO)}")
            done += got


def probe(pid: int, base: int, expect: bytes) -> bool:
    """Whether this process may read another's memory (same user, ptrace rules) and sees ``expect`` there."""
    if _FUNCS is None:
        return False
    got = np.zeros(len(expect), dtype=np.uint8)
    try:
        RemoteBuffer(pid=pid, base=base, itemsize=1, rank=-1).read(0, got)
    except LinkError:
        return False
    return got.tobytes() == expect
