"""In-process fakes for unit tests of one layer.

Stand-ins for what the layer is given (a clock), never for a component an integration test runs: those run for
real, as processes, over real gRPC.
"""

from __future__ import annotations


class FakeClock:
    """A clock the test moves by hand, for code that takes a ``clock`` callable: ``clock()`` is ``clock.now``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        """The time now, as the test set it."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on."""
        self.now += seconds
