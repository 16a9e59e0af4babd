"""What the ranks of a group must agree on for one collective, checked before any of its data moves.

Without the check, ranks that disagree do not always fail: an allreduce of 1,000 elements on one node and of
2,000 on the other returns on the first with a result of mixed collectives (its peer's first 1,000 elements),
and a broadcast from different sources returns each rank its own buffer. Each rank sends its ``CallSignature``
to its next rank on the ring and compares it with its previous rank's; since the ring passes through every rank,
all agree when every pair of neighbours does. 50 bytes on a link the collective may not otherwise use, sent
before the ranks wait on anything, so a collective costs one small message's latency more.
"""

from __future__ import annotations

import dataclasses
import struct

from hfreduce.errors import HFReduceError
from hfreduce.reduction import DType, ReduceOp

_NAME_BYTES = 24  # the longest name, "reduce_scatter_reg", fits
_WIRE = struct.Struct(f"!{_NAME_BYTES}sqbbqq")  # op name, count, dtype, reduce op, root, registered buffer
_DTYPES = list(DType)
_OPS = list(ReduceOp)


class CollectiveMismatchError(HFReduceError):
    """Ranks called different collectives at the same point: another kind, size, dtype, reduce op or root.

    Attributes:
        rank: the other rank whose call differs from this rank's.
    """

    def __init__(self, message: str, *, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


@dataclasses.dataclass(frozen=True)
class CallSignature:
    """One rank's call of a collective, as the other ranks must make it too.

    Attributes:
        op: the collective's name (``allreduce``, ``broadcast``, ...).
        count: elements of the buffer the collective is defined by (an all-gather's input, a reduce-scatter's
            output).
        dtype: the elements' type.
        reduce_op: the reduction, for the collectives that reduce.
        root: the source of a broadcast or the destination of a reduce, else -1.
        registered: whether the buffer is a registered one (``Group.alloc``). The local ranks of a node take
            different paths with and without one, so they must agree on it; ranks on different nodes need not.
    """

    op: str
    count: int
    dtype: DType
    reduce_op: ReduceOp | None = None
    root: int = -1
    registered: bool = False

    def pack(self) -> bytes:
        """The signature as ``WIRE_BYTES`` bytes."""
        op_index = -1 if self.reduce_op is None else _OPS.index(self.reduce_op)
        name = self.op.encode()
        if len(name) > _NAME_BYTES:  # a name cut short would differ from itself after a round trip
            raise ValueError(f"collective name {self.op!r} is longer than {_NAME_BYTES} bytes")
        return _WIRE.pack(name, self.count, _DTYPES.index(self.dtype), op_index, self.root, int(self.registered))

    @classmethod
    def unpack(cls, data: bytes) -> CallSignature:
        """The signature ``pack`` wrote.

        Raises:
            HFReduceError: ``data`` is not a signature (a peer's data stream is out of step with this rank's).
        """
        name, count, dtype, op_index, root, registered = _WIRE.unpack(data)
        if not 0 <= dtype < len(_DTYPES) or not -1 <= op_index < len(_OPS) or registered not in (0, 1):
            raise HFReduceError(f"a peer sent no collective signature but {data!r}: its stream is out of step")
        reduce_op = None if op_index < 0 else _OPS[op_index]
        text = name.rstrip(b"\0").decode(errors="replace")
        return cls(text, count, _DTYPES[dtype], reduce_op, root, bool(registered))

    def describe(self) -> str:
        """E.g. ``allreduce(sum) of 1000 x float32`` or ``broadcast from rank 1 of 8 x float16``."""
        kind = self.op if self.reduce_op is None else f"{self.op}({self.reduce_op.value})"
        root = "" if self.root < 0 else f" {'to' if self.op == 'reduce' else 'from'} rank {self.root}"
        buf = " registered" if self.registered else ""
        return f"{kind}{root} of {self.count} x {self.dtype.value}{buf}"

    def differences(self, other: CallSignature, *, same_node: bool) -> list[str]:
        """The fields in which ``other`` differs from this call (``registered`` only when ``same_node``)."""
        names = ["op", "count", "dtype", "reduce_op", "root"] + (["registered"] if same_node else [])
        labels = {"op": "collective", "reduce_op": "reduce op", "registered": "registered buffer"}
        return [labels.get(f, f) for f in names if getattr(self, f) != getattr(other, f)]


WIRE_BYTES = _WIRE.size
