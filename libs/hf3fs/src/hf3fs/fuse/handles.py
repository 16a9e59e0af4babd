"""One open file of the mount (a FUSE file handle)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import IO

from hf3fs.fuse.pending import PendingFile


@dataclass
class Handle:
    """An open file of the mount: the hf3fs file object, and what the mount tracks of it for flush and release."""

    file: IO[bytes]
    inode_id: int
    writable: bool
    end: int = 0  # highest byte written through this handle
    dirty: bool = False  # written since the length was last made exact on meta
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: PendingFile | None = None  # a new file meta does not know yet: ``file`` is a BytesIO (fuse.pending)
