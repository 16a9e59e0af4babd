"""Mounting and unmounting: checks before a mount, serving :class:`Hf3fsOperations` through libfuse, removing.

Served in this process or in a daemon; a dead or hung mount is removed too.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mfusepy

from ff_rpc import Identity, acting_as
from hf3fs.fuse.listings import ListingMark
from hf3fs.fuse.ops import MOUNT_STATS_XATTR, Hf3fsOperations
from hf3fs.fuse.options import DEFAULT_OPTIONS, MountOptions

logger = logging.getLogger(__name__)

MOUNT_WAIT_S = 30.0
FUSE_MAIN_LOOP_ENDED = 8  # fuse_main's status when its loop ended on a signal (libfuse 3 counts a signal an error)
UMOUNT_WAIT_S = 10.0


def _fusermount() -> str:
    for name in ("fusermount3", "fusermount"):
        found = shutil.which(name)
        if found:
            return found
    raise OSError(errno.ENOENT, "fusermount3 not found (install the fuse3 package)")


def check_fuse() -> None:
    """Raise OSError when this machine cannot mount FUSE file systems (no /dev/fuse, no libfuse)."""
    if not os.path.exists("/dev/fuse"):
        raise OSError(errno.ENODEV, "no /dev/fuse on this machine")
    _fusermount()


NOBODY = Identity(65534, (65534,))  # whom a --multi-user mount's check acts as


def check_mount_point(mountpoint: str) -> str:
    """The absolute mount point, if a mount can go there.

    Raises:
        OSError: it is missing (ENOENT) or not a folder (ENOTDIR); a dead FUSE mount is in the way (ENOTCONN:
            ``hf3fs umount`` removes it); something is mounted there already (EBUSY).
    """
    where = os.path.abspath(mountpoint)
    try:
        st = os.stat(where)
    except OSError as err:
        if err.errno == errno.ENOTCONN:
            raise OSError(
                errno.ENOTCONN,
                f"a dead mount is in the way (its daemon is gone): run 'hf3fs umount {where}' first",
                where,
            ) from None
        if err.errno == errno.ENOENT:
            raise OSError(errno.ENOENT, "the mount point does not exist (make the folder first)", where) from None
        raise
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "the mount point is not a folder", where)
    if os.path.ismount(where):
        raise OSError(errno.EBUSY, "something is mounted there already ('hf3fs umount' it first)", where)
    return where


def check_cluster(fs: Any, options: MountOptions) -> None:
    """Before anything is mounted: the cluster answers and takes the token, and a multi-user token may act for others.

    A ``--multi-user`` mount's token must be able to act for other users, or meta refuses the others' calls.

    Raises:
        OSError: with what went wrong (EACCES: the token; EIO/ConnectionError: the cluster).
    """
    fs.stat("/")
    if options.multi_user:
        try:
            with acting_as(NOBODY):
                fs.stat("/")
        except PermissionError as err:
            raise PermissionError(
                errno.EACCES, f"--multi-user needs a token that may act for other users (an admin's): {err.strerror}"
            ) from None


def mount(fs: Any, mountpoint: str, options: MountOptions = DEFAULT_OPTIONS, out: Any = None) -> None:
    """Serve 3FS at ``mountpoint`` in this process until it is unmounted (or SIGINT/SIGTERM).

    Nothing is mounted unless the mount point is usable, the cluster answers and it takes the token.
    """
    check_fuse()
    where = check_mount_point(mountpoint)
    check_cluster(fs, options)

    served = threading.Event()

    def ready() -> None:
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not os.path.ismount(where) and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.ismount(where):
            served.set()
        print(f"hf3fs: mounted on {where} (pid {os.getpid()})", file=out or sys.stdout, flush=True)

    ops = Hf3fsOperations(fs, options, on_ready=ready)
    try:
        _serve(ops, where, options)
    except RuntimeError as err:  # mfusepy: fuse_main's status (the reason went to stderr)
        if served.is_set() and err.args == (FUSE_MAIN_LOOP_ENDED,):
            # SIGTERM, SIGINT or SIGHUP (libfuse's handlers) ended the loop, and libfuse unmounted: a stop, as an
            # unmount is (an error reading /dev/fuse would end it so too, and libfuse prints that one)
            print(f"hf3fs: unmounted {where} (stopped by a signal)", file=out or sys.stdout, flush=True)
            return
        raise OSError(errno.EIO, f"libfuse could not mount or serve (status {err})", where) from None


_LIBFUSE: Any = mfusepy._libfuse  # the libfuse mfusepy loaded (fuse_invalidate_path has no wrapper there)
_LIBFUSE.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_LIBFUSE.fuse_invalidate_path.restype = ctypes.c_int
_FUSE_READDIR_PLUS = 1  # libfuse 3's enum fuse_readdir_flags: the kernel asks for readdirplus
_FUSE_FILL_DIR_PLUS = 2  # enum fuse_fill_dir_flags: this entry's attributes are whole (for the kernel to keep)


def _named(attrs: dict[str, Any]) -> dict[str, Any]:
    """What a plain readdir entry carries: the type (in the mode) and the inode number."""
    return {k: attrs[k] for k in ("st_mode", "st_ino") if k in attrs}


class _Fuse(mfusepy.FUSE):  # type: ignore[misc]  # mfusepy is untyped
    """mfusepy's FUSE, but the open handle of ftruncate, fchmod, fchown and futimens reaches the callback.

    mfusepy drops it; with nullpath_ok those calls come without a path. A file opened with O_APPEND is opened for
    direct I/O: its writes land where the mount appends them (``Hf3fsOperations._append``), not at the kernel's
    offset, so the kernel must not keep them in its page cache there. Folders are listed with readdirplus
    (``readdir_fuse_3``).
    """

    def __init__(self, operations: Hf3fsOperations, *args: Any, **kwargs: Any) -> None:
        # open folder handle -> its listing, with the mount's state when it was taken (readdir pages come from it)
        self._listings: dict[int, tuple[ListingMark, list[Any]]] = {}
        operations.invalidate_kernel = self._invalidate_path  # type: ignore[method-assign]
        super().__init__(operations, *args, **kwargs)  # serves until unmounted

    def _invalidate_path(self, path: str) -> None:
        """The kernel forgets the attributes and pages it keeps of ``path``, and asks again.

        libfuse's ``fuse_invalidate_path``, which mfusepy does not wrap; called from a callback (its context names the
        fuse handle).
        """
        fuse = _LIBFUSE.fuse_get_context().contents.fuse
        if fuse:
            _LIBFUSE.fuse_invalidate_path(fuse, path.encode(self.encoding, self.errors))  # -ENOENT: nothing kept

    def open(self, path: bytes, fip: Any) -> int:
        done = int(super().open(path, fip))
        if fip.contents.flags & os.O_APPEND:
            fip.contents.direct_io = 1
        return done

    def create(self, path: bytes, mode: int, fip: Any) -> int:
        done = int(super().create(path, mode, fip))
        if fip.contents.flags & os.O_APPEND:
            fip.contents.direct_io = 1
        return done

    def readdir_fuse_3(self, path: bytes | None, buf: Any, filler: Any, offset: int, fip: Any, flags: int) -> int:
        """readdir, and readdirplus when the kernel asks for it, a page at a time from one listing per open folder.

        Readdirplus hands each entry's attributes to the kernel where the listing had them whole
        (``Hf3fsOperations.readdir``), so ``ls -l`` and ``find -printf`` get them from the kernel's cache instead of
        a lookup and getattr (a meta ``Stat``) per name; mfusepy fills names, modes and inode numbers only. Entries
        go with their position + 1 as offset: libfuse 3.14 passes readdirplus attributes on only with offsets (with
        0 it drops them and counts a lookup the kernel never forgets). The listing is taken at offset 0 and kept
        until ``releasedir``; an entry of a later page goes without attributes where they may have changed through
        this mount since (``Hf3fsOperations.still_whole``).
        """
        fh = int(fip.contents.fh) if fip else 0
        taken = self._listings.get(fh) if offset else None
        if taken is None:
            taken = self.operations.listing(self._path(path), fh)
            self._listings[fh] = taken
        mark, listing = taken
        plus = bool(flags & _FUSE_READDIR_PLUS)
        for k in range(offset, len(listing)):
            item = listing[k]
            name, attrs = (item, None) if isinstance(item, str) else (item[0], item[1])
            plus_here = plus and attrs is not None and "st_nlink" in attrs and self.operations.still_whole(attrs, mark)
            st = None
            if attrs:
                st = mfusepy.c_stat()
                mfusepy.set_st_attrs(st, attrs if plus_here else _named(attrs), use_ns=self.use_ns)
            whole = _FUSE_FILL_DIR_PLUS if plus_here else 0
            if filler(buf, name.encode(self.encoding, self.errors), st, k + 1, whole) != 0:
                break  # the kernel's page is full: it asks again from this offset
        return 0

    def releasedir(self, path: bytes | None, fip: Any) -> int:
        self._listings.pop(int(fip.contents.fh) if fip else 0, None)
        return int(super().releasedir(path, fip))

    def _fh(self, fip: Any) -> int | None:
        return int(fip.contents.fh) if fip else None

    def _path(self, path: bytes | None) -> str | None:
        return None if path is None else path.decode(self.encoding, self.errors)

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        return int(self.operations.truncate(self._path(path), length, self._fh(fip)))

    def chmod_fuse_3(self, path: bytes | None, mode: int, fip: Any) -> int:
        return int(self.operations.chmod(self._path(path), mode, self._fh(fip)))

    def chown_fuse_3(self, path: bytes | None, uid: int, gid: int, fip: Any) -> int:
        if ctypes.c_uint32(uid + 1).value == 0:  # (uid_t)-1 arrives as 2**32 - 1: "unchanged"
            uid = -1
        if ctypes.c_uint32(gid + 1).value == 0:
            gid = -1
        return int(self.operations.chown(self._path(path), uid, gid, self._fh(fip)))

    def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
        times = None
        if buf:
            times = (
                mfusepy.time_of_timespec(buf.contents.actime, use_ns=self.use_ns),
                mfusepy.time_of_timespec(buf.contents.modtime, use_ns=self.use_ns),
            )
        return int(self.operations.utimens(self._path(path), times, self._fh(fip)))


def _serve(ops: Hf3fsOperations, where: str, options: MountOptions) -> None:
    _Fuse(
        ops,
        where,
        foreground=True,
        nothreads=False,
        debug=options.debug,
        fsname="hf3fs",
        subtype="hf3fs",
        hard_remove=True,
        use_ino=True,
        attr_timeout=options.attr_timeout_s,
        entry_timeout=options.attr_timeout_s,
        negative_timeout=options.attr_timeout_s,
        # multi-user: the kernel checks modes too (FIFOs and devices, which it opens without asking the mount;
        # a chmod from a non-owner is then only its clearing of set-id bits on write), and meta checks again
        **({"allow_other": True, "default_permissions": True} if options.multi_user else {}),
    )


@dataclass(frozen=True)
class BackgroundMount:
    """A mount served by a daemon process."""

    where: str
    pid: int
    log_file: str

    def __str__(self) -> str:
        where, pid, log = self.where, self.pid, self.log_file
        return f"mounted 3FS on {where} (daemon pid {pid}, log {log}); unmount: hf3fs umount {where}"


def mount_background(
    mountpoint: str, mgmtd: str, token: str, options: MountOptions, environ: Mapping[str, str]
) -> BackgroundMount:
    """Start a daemon that mounts ``mountpoint`` and wait until the mount serves.

    The token goes to the daemon through its environment, not its command line.

    Raises:
        OSError: no FUSE here, or the daemon did not mount in time (its log's last lines in the message).
    """
    check_fuse()
    where = os.path.abspath(mountpoint)
    log_file = options.log_file or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"hf3fs-mount-{os.getuid()}-{where.strip('/').replace('/', '_')}.log"
    )
    argv = [sys.executable, "-m", "hf3fs", "mount", where, "--foreground"]
    argv += ["--keep-ids"] if options.keep_ids else []
    argv += ["--multi-user"] if options.multi_user else []
    argv += ["--attr-timeout-s", str(options.attr_timeout_s)]
    argv += ["--writeback"] if options.writeback else []
    argv += ["--debug"] if options.debug else []
    env = {**environ, **({"FF_MGMTD_ADDRESSES": mgmtd} if mgmtd else {}), **({"FF_TOKEN": token} if token else {})}
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True)
    deadline = time.monotonic() + MOUNT_WAIT_S
    while time.monotonic() < deadline:
        if os.path.ismount(where):
            return BackgroundMount(where, proc.pid, log_file)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    tail = ""
    with contextlib.suppress(OSError), open(log_file, errors="replace") as f:
        tail = "".join(f.readlines()[-5:]).strip()
    raise OSError(errno.EIO, f"the mount did not come up (log {log_file}): {tail}", where)


def _fuse_mounts() -> dict[str, str]:
    """FUSE mount points of this mount namespace -> their device ("major:minor"), read from mountinfo.

    From mountinfo because a stat of a hung mount would block.
    """
    found: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-") if "-" in fields else -1
            if sep > 4 and fields[sep + 1].startswith("fuse"):
                point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
                found[point.replace("\\134", "\\")] = fields[2]
    return found


FUSECTL = "/sys/fs/fuse/connections"


def _abort_connection(device: str) -> bool:
    """Abort a FUSE connection (what a hung or dead daemon leaves): its waiting calls fail at once.

    Root only; the fusectl file system is mounted first where the system has not.
    """
    abort = os.path.join(FUSECTL, device.partition(":")[2], "abort")
    if not os.path.exists(abort) and os.path.isdir(FUSECTL) and not os.listdir(FUSECTL):
        subprocess.run(["mount", "-t", "fusectl", "fusectl", FUSECTL], capture_output=True, check=False, timeout=10)
    try:
        with open(abort, "w", encoding="ascii") as f:
            f.write("1")
    except OSError:
        return False
    return True


def _serving(where: str) -> bool:
    """Whether the mount's daemon answers: its counters' attribute, from its memory (no meta call), within a while."""
    probe = [sys.executable, "-c", "import os, sys; os.getxattr(sys.argv[1], sys.argv[2])", where, MOUNT_STATS_XATTR]
    try:  # in a process of its own: a call to a hung daemon blocks (until killed, as the timeout does)
        return subprocess.run(probe, capture_output=True, timeout=UMOUNT_WAIT_S, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def umount(mountpoint: str) -> None:
    """Unmount a FUSE mount (the daemon serving it then exits); a mount whose daemon died or hangs is removed too.

    Its connection is then aborted (as root) and it is detached lazily. A live mount in use is left mounted: aborting
    it would fail its programs' calls and lose what they wrote and had not closed yet.

    Raises:
        OSError: nothing is mounted there (EINVAL), it is in use and serving (EBUSY), or it could not be removed (with
            fusermount's reason).
    """
    where = os.path.abspath(mountpoint)
    device = _fuse_mounts().get(where)
    if device is None:
        raise OSError(errno.EINVAL, "no FUSE mount there", where)
    try:
        proc = subprocess.run(
            [_fusermount(), "-u", where], capture_output=True, text=True, check=False, timeout=UMOUNT_WAIT_S
        )
        if proc.returncode == 0:
            return
        reason = proc.stderr.strip() or f"fusermount -u exited {proc.returncode}"
    except subprocess.TimeoutExpired:
        reason = f"fusermount -u did not return in {UMOUNT_WAIT_S:.0f} s"
    if _fuse_mounts().get(where) != device:  # gone meanwhile
        return
    if "busy" in reason.lower() and _serving(where):  # in use, and alive: aborting would lose its files' writes
        raise OSError(
            errno.EBUSY,
            "in use (a process has a file or its working folder there): close them first, or detach it with "
            "'fusermount3 -uz', which lets those finish",
            where,
        )
    aborted = _abort_connection(device)
    lazy = subprocess.run(
        [_fusermount(), "-u", "-z", where], capture_output=True, text=True, check=False, timeout=UMOUNT_WAIT_S
    )
    if lazy.returncode != 0 and where in _fuse_mounts():
        raise OSError(errno.EBUSY, f"{reason}; lazy unmount: {lazy.stderr.strip()}", where)
    logger.info("%s: %s; %s and detached it", where, reason, "aborted its connection" if aborted else "")
