"""CRC-32C (Castagnoli), the chunk checksum of 3FS, hardware-accelerated by the ``crc32c`` package."""

from __future__ import annotations

import crc32c as _crc32c


def crc32c_of(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32C of ``data``, continuing from ``value`` (0 starts a new checksum)."""
    return int(_crc32c.crc32c(data, value))
