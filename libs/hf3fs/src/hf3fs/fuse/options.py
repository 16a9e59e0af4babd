"""How ``hf3fs mount`` mounts: its options."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class MountOptions:
    """How to mount.

    Attributes:
        foreground: serve in this process until unmounted (else a daemon process serves).
        debug: libfuse's debug trace on stderr.
        keep_ids: show 3FS uids/gids; by default every inode appears owned by the mounting user (access is
            decided by meta for the token's user anyway, and tools such as git refuse foreign-owned repos).
        log_file: where a background daemon writes its log.
        attr_timeout_s: how long the kernel may cache attributes and names, and the mount meta's answers
            (hf3fs.fuse.attrs); 0: neither.
        writeback: new files created write-only and exclusive (``tar x``) start in the mount's memory and reach
            meta through the client's write-back at close (hf3fs.fuse.pending); single-user mounts only. Off by
            default: an error of the late commit (a quota exceeded, a folder another client renamed meanwhile)
            reaches only the mount's log, not the program that wrote the file.
        multi_user: serve every user of this machine (``allow_other``): each request runs in meta as the uid and
            groups of the process that made it, and inodes show their 3FS owners. Needs a token that may act for
            other users (an admin's); a plain mount serves its own user only (the kernel refuses the others).
    """

    foreground: bool = False
    debug: bool = False
    keep_ids: bool = False
    log_file: str = ""
    attr_timeout_s: float = 1.0
    multi_user: bool = False
    writeback: bool = False


DEFAULT_OPTIONS = MountOptions()
