"""Failure arrivals of Fire-Flyer 2 (paper Tables VII and VIII) for the simulator.

Two kinds, each a Poisson process per node at the paper's average rate over its ~1,250 nodes:

- hardware: Table VII's CPU-memory ECC and GPU Xid 63/64/79/94/95 failures, 54 + 149 = 203 over the six
  months 2023-10 .. 2024-03 (its "Network" column is the flash cuts below, counted there). The node leaves
  (its lease lapses: the run on it ends NODE_LOST) and comes back after ``repair_s`` (a GPU reset or a
  reboot: the paper gives no repair time, an hour is our assumption).
- link: Table VIII's InfiniBand flash cuts, 213 from 2023-04-19 to 2024-03-31 (348 days). The link drops
  for a moment: the run on the node fails (its ranks lose their peers) and restarts; the node stays.

The paper's rates are per cluster of 1,250 nodes; ``scale`` multiplies them (1: the paper's).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

PAPER_NODES = 1250
DAY_S = 86400.0
# Table VII: 54 main-memory + 120 xid63 + 1 xid64 + 15 xid79 + 7 xid94 + 6 xid95, Oct 2023 .. Mar 2024.
HARDWARE_PER_NODE_S = 203 / (182 * DAY_S * PAPER_NODES)
# Table VIII: 213 flash cuts, 2023-04-19 .. 2024-03-31.
LINK_PER_NODE_S = 213 / (348 * DAY_S * PAPER_NODES)


class FailureKind(enum.Enum):
    """What failed: a node (it leaves until repaired) or its network link (a flash cut)."""

    HARDWARE = "hardware"
    LINK = "link"


@dataclass(frozen=True, slots=True)
class FailureEvent:
    """One failure: when, on which node, what kind."""

    at_s: float
    node_id: int
    kind: FailureKind


@dataclass(frozen=True, kw_only=True)
class FailureModel:
    """The failure arrivals of a cluster of ``num_nodes`` nodes (see the module docstring).

    Attributes:
        scale: multiplies the paper's rates (1: as measured on Fire-Flyer 2).
        repair_s: how long a node that failed is gone.
    """

    scale: float = 1.0
    repair_s: float = 3600.0

    def __post_init__(self) -> None:
        if not self.scale >= 0 or not self.repair_s >= 0:
            raise ValueError(f"failure scale and repair time must be >= 0, not {self.scale} and {self.repair_s}")

    def arrivals(self, num_nodes: int, seed: int) -> FailureArrivals:
        """The failures of ``num_nodes`` nodes one by one, the same for the same seed."""
        return FailureArrivals(self, num_nodes, seed)


class FailureArrivals:
    """The next failure, drawn on demand (the simulation's length is not known in advance)."""

    def __init__(self, model: FailureModel, num_nodes: int, seed: int) -> None:
        self._rng = random.Random(seed)
        self._num_nodes = num_nodes
        self._hardware_rate = model.scale * HARDWARE_PER_NODE_S * num_nodes
        self._rate = self._hardware_rate + model.scale * LINK_PER_NODE_S * num_nodes
        self._at_s = 0.0
        self.next: FailureEvent | None = None
        self.advance()

    def advance(self) -> None:
        """Draw the failure after ``next`` (None forever when the rate is 0)."""
        if self._rate <= 0:
            self.next = None
            return
        self._at_s += self._rng.expovariate(self._rate)
        node_id = self._rng.randrange(1, self._num_nodes + 1)
        hardware = self._rng.random() < self._hardware_rate / self._rate
        self.next = FailureEvent(self._at_s, node_id, FailureKind.HARDWARE if hardware else FailureKind.LINK)
