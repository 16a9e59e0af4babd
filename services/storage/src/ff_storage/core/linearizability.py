"""A linearizability checker for registers (pure).

Is a recorded history of reads and writes explainable by some order of its operations, each taking effect at
one instant between its start and its end?

The search is Wing & Gong's, with Lowe's memo of (operations taken, state) as Porcupine does it: walk the
history's events in time order, tentatively take each operation whose start has been reached and that the
model allows in the current state, and back up when an operation's end is reached before it was taken.
Keys are independent registers (P-compositionality), each checked alone. A write whose outcome is unknown
(it failed, timed out, or the caller gave up) has no end: it may take effect at any time after its start,
or never (taken last, after every read, it changes nothing anyone saw).

The register model: a write sets the value; a read must return the value of the latest write taken before
it (``initial`` before any). Values should be unique per write (a writer id and a counter), so that a read
names the write it saw.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace

WRITE = "write"
READ = "read"


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One call on one key, a write or a read, between ``start`` and ``end``.

    ``kind`` WRITE (of ``value``) or READ (that returned ``value``; None = the initial value, e.g. chunk not
    found); ``end`` is ``math.inf`` when the outcome is unknown.
    """

    key: Hashable
    kind: str
    value: Hashable
    start: float
    end: float = math.inf
    client: str = ""


@dataclass(frozen=True)
class Verdict:
    """The checker's answer for one key (``key`` None: every key passed)."""

    ok: bool
    key: Hashable = None
    # When not ok: the first operations (by start) that the longest order the search found leaves out.
    unexplained: tuple[Operation, ...] = ()
    num_operations: int = 0

    def describe(self) -> str:
        """A human-readable verdict, listing the unexplained operations when the history is not linearizable."""
        if self.ok:
            return f"linearizable ({self.num_operations} operations)"
        lines = [f"key {self.key!r}: not linearizable; no order explains these operations:"]
        lines += [f"  {op.client} {op.kind} {op.value!r} [{op.start:.6f}, {op.end:.6f}]" for op in self.unexplained]
        return "\n".join(lines)


def check_history(ops: Iterable[Operation], initial: Hashable = None) -> Verdict:
    """Check every key's operations; the first key that is not linearizable, else ok."""
    by_key: dict[Hashable, list[Operation]] = defaultdict(list)
    for op in ops:
        if op.kind not in (WRITE, READ):
            raise ValueError(f"operation kind {op.kind!r}: expected {WRITE!r} or {READ!r}")
        if op.end < op.start:
            raise ValueError(f"operation ends before it starts: {op}")
        by_key[op.key].append(op)
    total = 0
    for key_ops in by_key.values():
        verdict = check_register(key_ops, initial)
        if not verdict.ok:
            return verdict
        total += verdict.num_operations
    return Verdict(True, num_operations=total)


class _Events:
    """The history as a doubly linked list of call and return events, in time order.

    A call comes before a return at the same instant: operations that merely touch count as concurrent.
    Index 0 is the head sentinel.
    """

    def __init__(self, ops: list[Operation]) -> None:
        events = [(op.start, 0, i) for i, op in enumerate(ops)] + [(op.end, 1, i) for i, op in enumerate(ops)]
        events.sort()
        n = len(events)
        self.is_call = [False] + [e[1] == 0 for e in events]
        self.op = [-1] + [e[2] for e in events]
        self.next = list(range(1, n + 2))
        self.next[n] = 0
        self.prev = [n, *range(n)]
        self.ret_of = [0] * len(ops)
        for pos in range(1, n + 1):
            if not self.is_call[pos]:
                self.ret_of[self.op[pos]] = pos

    def lift(self, call: int) -> None:
        """Take an operation out: its call and its return event."""
        for pos in (call, self.ret_of[self.op[call]]):
            self.next[self.prev[pos]] = self.next[pos]
            self.prev[self.next[pos]] = self.prev[pos]

    def unlift(self, call: int) -> None:
        for pos in (self.ret_of[self.op[call]], call):
            self.prev[self.next[pos]] = pos
            self.next[self.prev[pos]] = pos


def check_register(ops: list[Operation], initial: Hashable = None) -> Verdict:
    """Whether one register's operations are linearizable (see the module doc)."""
    key = ops[0].key if ops else None
    ops = _bound_unknown_writes(ops)
    events = _Events(ops)
    state = initial
    taken = 0  # bitset of operations taken
    memo: set[tuple[int, Hashable]] = set()
    stack: list[tuple[int, Hashable]] = []
    best, best_taken = 0, 0
    pos = events.next[0]
    while pos != 0:
        if events.is_call[pos]:
            op = ops[events.op[pos]]
            if op.kind == WRITE or op.value == state:
                after = op.value if op.kind == WRITE else state
                bit = 1 << events.op[pos]
                if (taken | bit, after) not in memo:
                    memo.add((taken | bit, after))
                    stack.append((pos, state))
                    state, taken = after, taken | bit
                    events.lift(pos)
                    if len(stack) > best:
                        best, best_taken = len(stack), taken
                    pos = events.next[0]
                    continue
            pos = events.next[pos]
            continue
        if not stack:  # an operation ended before any order could take it
            return Verdict(False, key, _unexplained(ops, best_taken), len(ops))
        pos, state = stack.pop()
        taken &= ~(1 << events.op[pos])
        events.unlift(pos)
        pos = events.next[pos]
    return Verdict(True, key, (), len(ops))


def _bound_unknown_writes(ops: list[Operation]) -> list[Operation]:
    """Writes of unknown outcome, made finite without changing the answer (values are unique per write).

    One nobody read is left out (taken last, it changes nothing anyone saw); one somebody read must have
    taken effect before the first of those reads ended, so that is its end. Otherwise each such write
    could be taken at any point of the search, which grows exponentially with their number.
    """
    read_by: dict[Hashable, float] = {}
    for op in ops:
        if op.kind == READ:
            read_by[op.value] = min(read_by.get(op.value, math.inf), op.end)
    out = []
    for op in ops:
        if op.kind == WRITE and op.end == math.inf:
            if op.value not in read_by:
                continue
            out.append(replace(op, end=max(op.start, read_by[op.value])))
            continue
        out.append(op)
    return out


def _unexplained(ops: list[Operation], taken: int) -> tuple[Operation, ...]:
    """The first operations (by start) that the deepest order the search found could not take."""
    left = [op for i, op in enumerate(ops) if not taken >> i & 1]
    return tuple(sorted(left, key=lambda o: (o.start, o.end))[:5])
