"""3FS client library: the file system (``hf3fs.connect``), chunk I/O over storage chains, placement, admin.

The file system gives files, directories and batch I/O over meta and storage; chunk I/O over the chains is
``hf3fs.storage_client``.
"""

from ff_fsprotocol.checksum import crc32c_of
from hf3fs.dataset import FileDataset
from hf3fs.fs import DirEntry, FileSystem, ForkedProcessError, Quota, Stat, StatFs, TrashEntry, connect
from hf3fs.meta_client import Hf3fsError, MetaClient
from hf3fs.storage_client import ChunkRead, ChunkWrite, ReadOutcome, StorageClient, StorageIoError, WriteOutcome
from hf3fs.writeback import WritebackError, WritebackOptions, WritebackStats

__all__ = [
    "ChunkRead",
    "ChunkWrite",
    "DirEntry",
    "FileDataset",
    "FileSystem",
    "ForkedProcessError",
    "Hf3fsError",
    "MetaClient",
    "Quota",
    "ReadOutcome",
    "Stat",
    "StatFs",
    "StorageClient",
    "StorageIoError",
    "TrashEntry",
    "WriteOutcome",
    "WritebackError",
    "WritebackOptions",
    "WritebackStats",
    "connect",
    "crc32c_of",
]
