"""The hf3fs file system, synchronous: metadata through meta, data straight to storage.

``hf3fs.connect()`` gives a FileSystem; it runs the async gRPC clients on one private event-loop thread,
so any number of threads may use it at once (FUSE callbacks, fsspec, the CLI, data loaders).

Processes: gRPC does not survive ``fork()`` (a child of a process that has used it hangs in its first
call), so a FileSystem, or a new one, used in a forked child raises ``ForkedProcessError`` at once. Worker
processes are started with ``spawn`` or ``forkserver`` (torch: ``DataLoader(...,
multiprocessing_context="forkserver")``); a FileSystem pickles to its arguments and connects again, as a
client of its own, in the process that unpickles it.

Modules: ``filesystem`` (``FileSystem``, the user's API), ``connection`` (the clients and their loop thread),
``sessions`` (write sessions: closes, lease renewal), ``data`` (opening files, batch I/O), ``writeback_queue``
and ``exits`` (the write-back queue, committed at exit), ``paths``.
"""

from hf3fs.entries import DirEntry, Quota, Stat, StatFs, TrashEntry
from hf3fs.forks import ForkedProcessError
from hf3fs.fs.data import WHOLE_FILE
from hf3fs.fs.filesystem import FileSystem, connect

__all__ = [
    "WHOLE_FILE",
    "DirEntry",
    "FileSystem",
    "ForkedProcessError",
    "Quota",
    "Stat",
    "StatFs",
    "TrashEntry",
    "connect",
]
