"""Memory the local ranks of a node share: registered buffers, and making a shared segment per local rank.

``Registered`` is a buffer every local rank allocated together (``Group.alloc``), reduced with no copy in or out;
``shared_segments`` makes one segment per local rank and maps every one of them in every local rank (the registered
buffers and ``group.Runtime``'s staging slots are made so).
"""

from __future__ import annotations

import dataclasses
import struct

from hfreduce.errors import HFReduceError
from hfreduce.local import LocalComm
from hfreduce.shm import Segment

# The mark in the signature of the node barrier before shared segments are made, with every local rank's size (a
# high bit, like the marks of group.Runtime's barriers: _ALLGATHER_BARRIER and _REDUCE_SCATTER_BARRIER)
_SEGMENT_BARRIER = 1 << 61
_SIZE = struct.Struct("!Q")


@dataclasses.dataclass
class Registered:
    """A buffer allocated in shared memory by every local rank together (zero-copy allreduce)."""

    index: int
    nbytes: int
    segments: list[Segment]


def shared_segments(
    local: LocalComm, name: str, nbytes: int, *, node_rank: int, local_rank: int, huge: bool = False
) -> list[Segment]:
    """Each local rank creates ``nbytes`` of shared memory; every rank maps everyone's.

    A node-local collective: every local rank of node ``node_rank`` calls it, through ``local``.

    Raises:
        HFReduceError: the local ranks asked for different sizes (each maps the others' segments with its own
            size, so a larger one would map past the end of a smaller); nothing is made.
    """
    sizes = [_SIZE.unpack(row)[0] for row in local.barrier(_SEGMENT_BARRIER, _SIZE.pack(nbytes))]
    if len(set(sizes)) > 1:
        raise HFReduceError(
            f"the local ranks of node {node_rank} asked for shared buffers of different sizes: "
            f"{sizes} bytes, by local rank (Group.alloc must get the same shape and dtype on every local rank)"
        )
    own = Segment.create(name, nbytes, huge=huge)
    segs: list[Segment] = []
    try:
        table = local.exchange_fds([own.fd])
        for lr, fds in enumerate(table):
            segs.append(own if lr == local_rank else Segment.attach(fds[0], nbytes))
        local.barrier(nbytes)
    except BaseException:
        own.close()
        for seg in segs:
            seg.close()
        raise
    own.release_fd()  # every peer has mapped it: the kernel frees it when the last mapping goes
    return segs
