"""mgmtd's one exception hierarchy (the servicer maps each to one status code in ff_mgmtd.errors)."""

from __future__ import annotations

from collections.abc import Sequence

PRIMARY_ADDRESS_METADATA = "ff-primary-address"
# Sent with every NotPrimary: the call was not executed, so any call may be retried elsewhere.
NOT_PRIMARY_METADATA = "ff-not-primary"


class MgmtdError(Exception):
    """Base of every error mgmtd answers with."""


class InvalidRequest(MgmtdError):
    """Malformed or missing fields."""


class NotFoundError(MgmtdError):
    """A node, chain, chain table, user, group or token that does not exist."""


class AlreadyExistsError(MgmtdError):
    """A user, group or id that is taken."""


class NoFreeId(MgmtdError):
    """Every id of a kind is taken."""


class StaleVersion(MgmtdError):
    """A compare-and-set against a version that is no longer current."""


class Conflict(MgmtdError):
    """The request contradicts stored state (e.g. a node id registered with another type)."""


class Forbidden(MgmtdError):
    """The caller may not do this to that object (e.g. revoke another user's token)."""


class InvalidToken(MgmtdError):
    """Unknown, malformed, expired or revoked token, or a disabled user."""


class NotPrimary(MgmtdError):
    """This instance is a standby; the caller should go to the primary."""

    def __init__(self, primary_address: str) -> None:
        where = f"primary is {primary_address}" if primary_address else "no primary is elected yet"
        super().__init__(f"this mgmtd instance is not the primary; {where}")
        self.primary_address = primary_address

    def trailing_metadata(self) -> Sequence[tuple[str, str]]:
        """What the status carries so clients retry elsewhere: the not-primary mark and, when known, the primary."""
        where = ((PRIMARY_ADDRESS_METADATA, self.primary_address),) if self.primary_address else ()
        return ((NOT_PRIMARY_METADATA, "1"), *where)
