"""Double binary trees over nodes, built exactly as NCCL's ``trees.cc``, with zone-aware ordering."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

NO_RANK = -1


@dataclasses.dataclass(frozen=True)
class TreeNode:
    """One node's links in one tree (``NO_RANK`` parent at the root)."""

    parent: int
    children: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Tree:
    """A spanning tree over node ranks ``0..n-1``."""

    root: int
    nodes: tuple[TreeNode, ...]

    def __getitem__(self, node: int) -> TreeNode:
        return self.nodes[node]

    def depth(self) -> int:
        """Number of edges on the longest root-to-leaf path."""
        best, stack = 0, [(self.root, 0)]
        while stack:
            node, d = stack.pop()
            best = max(best, d)
            stack.extend((c, d + 1) for c in self.nodes[node].children)
        return best


def nccl_btree(nranks: int, rank: int) -> tuple[int, int, int]:
    """``ncclGetBtree``: (up, down0, down1) of ``rank`` in the tree rooted at 0; -1 means none."""
    bit = 1
    while bit < nranks:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return NO_RANK, NO_RANK, (bit >> 1) if nranks > 1 else NO_RANK
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = NO_RANK if lowbit == 0 else rank - lowbit
    down1 = NO_RANK if lowbit == 0 else rank + lowbit
    while down1 >= nranks:  # NCCL halves lowbit until the second child is in range
        down1 = NO_RANK if lowbit == 0 else rank + lowbit
        lowbit >>= 1
    return up, down0, down1


def nccl_dtree(nranks: int, rank: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``ncclGetDtree``: the btree links and the second tree's links (mirror if even, shift if odd)."""
    first = nccl_btree(nranks, rank)

    if nranks % 2 == 1:
        u, d0, d1 = nccl_btree(nranks, (rank - 1 + nranks) % nranks)

        def unmap(x: int) -> int:
            return NO_RANK if x == NO_RANK else (x + 1) % nranks
    else:
        u, d0, d1 = nccl_btree(nranks, nranks - 1 - rank)

        def unmap(x: int) -> int:
            return NO_RANK if x == NO_RANK else nranks - 1 - x

    return first, (unmap(u), unmap(d0), unmap(d1))


def _to_tree(links: Sequence[Sequence[int]]) -> Tree:
    nodes = tuple(TreeNode(up, tuple(c for c in downs if c != NO_RANK)) for up, *downs in links)
    roots = [i for i, n in enumerate(nodes) if n.parent == NO_RANK]
    return Tree(root=roots[0], nodes=nodes)


def double_binary_tree(nranks: int) -> tuple[Tree, Tree]:
    """NCCL's two trees over ``nranks`` positions (roots 0 and ``1 if odd else n-1``)."""
    pairs = [nccl_dtree(nranks, r) for r in range(nranks)]
    return _to_tree([p[0] for p in pairs]), _to_tree([p[1] for p in pairs])


def zone_members(zones: Sequence[str]) -> list[list[int]]:
    """Node ranks grouped by zone: zones in order of first appearance, nodes by rank inside a zone."""
    order: dict[str, list[int]] = {}
    for node, zone in enumerate(zones):
        order.setdefault(zone, []).append(node)
    return list(order.values())


def node_order(zones: Sequence[str]) -> list[int]:
    """The zone-by-zone order of node ranks used for the ring and the trees."""
    return [n for members in zone_members(zones) for n in members]


def build_trees(zones: Sequence[str]) -> tuple[Tree, Tree]:
    """The double binary tree over nodes whose zones are ``zones[node_rank]``.

    With one zone this is NCCL's construction on node ranks. With several zones each zone gets its own
    NCCL double tree and zones are chained: in the first tree zone ``z+1``'s root (its first node) hangs
    under zone ``z``'s last node; in the second tree zone ``z``'s root hangs under zone ``z+1``'s first
    node. When every zone has an even number of nodes the second tree's zone roots are the zones' last
    nodes, so both trees cross each zone boundary through the same single pair of nodes.
    """
    groups = zone_members(zones)
    n = len(zones)
    links: list[list[list[int]]] = [[[NO_RANK, NO_RANK, NO_RANK] for _ in range(n)] for _ in range(2)]
    roots: list[list[int]] = [[], []]
    for members in groups:
        for t, tree in enumerate(double_binary_tree(len(members))):
            roots[t].append(members[tree.root])
            for pos, tn in enumerate(tree.nodes):
                node = links[t][members[pos]]
                node[0] = NO_RANK if tn.parent == NO_RANK else members[tn.parent]
                for i, c in enumerate(tn.children):
                    node[1 + i] = members[c]
    for z in range(1, len(groups)):
        _attach(links[0], child=roots[0][z], parent=groups[z - 1][-1])
        _attach(links[1], child=roots[1][z - 1], parent=groups[z][0])
    return _to_tree(links[0]), _to_tree(links[1])


def _attach(links: list[list[int]], *, child: int, parent: int) -> None:
    links[child][0] = parent
    slot = links[parent]
    if slot[1] == NO_RANK:
        slot[1] = child
    elif slot[2] == NO_RANK:
        slot[2] = child
    else:
        slot.append(child)  # a third child: only where a zone boundary lands on a full interior node


def cross_zone_pairs(tree: Tree, zones: Sequence[str]) -> set[frozenset[int]]:
    """The node pairs linked by ``tree`` whose zones differ."""
    return {
        frozenset((node, tn.parent))
        for node, tn in enumerate(tree.nodes)
        if tn.parent != NO_RANK and zones[node] != zones[tn.parent]
    }
