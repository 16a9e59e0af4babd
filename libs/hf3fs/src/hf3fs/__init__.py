"""3FS client library: chunk I/O over storage chains (``hf3fs.storage_client``), placement, admin."""

from hf3fs.checksum import crc32c_of
from hf3fs.storage_client import ChunkRead, ChunkWrite, ReadOutcome, StorageClient, StorageIoError, WriteOutcome

__all__ = [
    "ChunkRead",
    "ChunkWrite",
    "ReadOutcome",
    "StorageClient",
    "StorageIoError",
    "WriteOutcome",
    "crc32c_of",
]
