"""Errors raised by ff_store."""

from __future__ import annotations


class StoreError(Exception):
    """Base of the errors ff_store itself raises (database errors propagate as SQLAlchemy's)."""


class TransactionConflict(StoreError):
    """A transaction kept losing to concurrent ones and ran out of retries.

    The last database error (serialization failure, deadlock or locked database) is ``__cause__``.
    Nothing was committed: the caller may try again later or report the service as busy.
    """

    def __init__(self, num_attempts: int) -> None:
        super().__init__(f"transaction still conflicted after {num_attempts} attempts")
        self.num_attempts = num_attempts
