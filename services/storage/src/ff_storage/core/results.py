"""What a chunk update ends with, as the node's code passes it around.

The servicer turns it into the wire's ``UpdateResult``; ``wire`` converts both ways.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class IoStatus(enum.IntEnum):
    """A chunk IO's status: the values of ``fireflyer.storage.v1.ChunkIoStatus``.

    A unit test keeps them equal; the proto documents each.
    """

    UNSPECIFIED = 0
    OK = 1
    PENDING_VERSION = 2
    CHUNK_NOT_FOUND = 3
    STALE_CHAIN_VERSION = 4
    TARGET_NOT_SERVING = 5
    CHECKSUM_MISMATCH = 6
    DATA_TIMEOUT = 7
    NO_SPACE = 8
    PERMISSION_DENIED = 9
    FORWARD_FAILED = 10
    MISSING_UPDATE = 11


@dataclass
class UpdateResult:
    """One update's outcome: its status and, once committed, the chunk's version, length and CRC-32C."""

    status: IoStatus = IoStatus.UNSPECIFIED
    message: str = ""
    committed_version: int = 0
    chunk_length: int = 0
    chunk_checksum: int | None = None  # of the whole chunk; None: not told

    @property
    def ok(self) -> bool:
        """Whether the update succeeded."""
        return self.status is IoStatus.OK
