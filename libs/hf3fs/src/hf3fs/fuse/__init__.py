"""``hf3fs mount``: 3FS as a POSIX mount through libfuse3 (mfusepy), multi-threaded, over one client.

- :mod:`hf3fs.fuse.ops`: the FUSE callbacks (:class:`Hf3fsOperations`) over a :class:`hf3fs.FileSystem`;
- :mod:`hf3fs.fuse.callers`: how a callback runs (its failure as an errno, as which user with ``--multi-user``);
- :mod:`hf3fs.fuse.handles`: the open files (handles) by number and by inode;
- :mod:`hf3fs.fuse.pending`: new files whose bytes wait in memory for the write-back (``--writeback``);
- :mod:`hf3fs.fuse.attrs`: what the mount remembers of meta's answers between callbacks (attributes, names);
- :mod:`hf3fs.fuse.options`: how to mount (:class:`MountOptions`);
- :mod:`hf3fs.fuse.serve`: checks before mounting, serving in this process or a daemon, unmounting.
"""

from __future__ import annotations

from hf3fs.fuse.callers import caller_identity
from hf3fs.fuse.ops import UTIME_NOW, UTIME_OMIT, Hf3fsOperations
from hf3fs.fuse.options import MountOptions
from hf3fs.fuse.serve import (
    NOBODY,
    BackgroundMount,
    check_cluster,
    check_fuse,
    check_mount_point,
    mount,
    mount_background,
    umount,
)

__all__ = [
    "NOBODY",
    "UTIME_NOW",
    "UTIME_OMIT",
    "BackgroundMount",
    "Hf3fsOperations",
    "MountOptions",
    "caller_identity",
    "check_cluster",
    "check_fuse",
    "check_mount_point",
    "mount",
    "mount_background",
    "umount",
]
