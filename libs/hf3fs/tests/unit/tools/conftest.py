"""Unit tests of the tools over the client API (fsspec, CLI, FUSE callbacks), run on a stand-in of that API over a
local folder (no sockets). The integration tests run the same tools on a real cluster."""

from __future__ import annotations

import io
import os
import shutil
import stat as statmod
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hf3fs.fs import DirEntry, Quota, Stat, StatFs, TrashEntry
from hf3fs.fs.paths import absolute as _abs


class _Raw(io.RawIOBase):
    """Like the client's raw file: a Python RawIOBase (no ResourceWarning when a reader drops it unclosed)."""

    def __init__(self, path: str, mode: str) -> None:
        self._f = io.FileIO(path, mode)

    def readable(self) -> bool:
        return self._f.readable()

    def writable(self) -> bool:
        return self._f.writable()

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        return self._f.readinto(b) or 0

    def write(self, b: Any) -> int:
        return self._f.write(b) or 0

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def tell(self) -> int:
        return self._f.tell()

    def truncate(self, size: int | None = None) -> int:
        return self._f.truncate(size)

    def fileno(self) -> int:
        return self._f.fileno()

    def close(self) -> None:
        self._f.close()
        super().close()

    # what the mount's handles use of the client's raw file (hf3fs.files.RawFile)
    layout = SimpleNamespace(chunk_size=8192)  # the buffer of a mount handle: small, so tests fill it

    def ensure_room(self, end: int) -> None:
        """No quotas on the stand-in's files."""

    def write_extents(self, extents: Any) -> None:
        for at, data in extents:
            os.pwrite(self._f.fileno(), data, at)

    def fsync(self) -> None:
        os.fsync(self._f.fileno())


class _File(io.BufferedRandom):
    def fsync(self) -> None:
        self.flush()
        os.fsync(self.raw.fileno())


class _Writer(io.BufferedWriter):
    def fsync(self) -> None:
        self.flush()
        os.fsync(self.raw.fileno())


_KINDS = {
    statmod.S_IFDIR: "directory",
    statmod.S_IFLNK: "symlink",
    statmod.S_IFIFO: "fifo",
    statmod.S_IFSOCK: "socket",
    statmod.S_IFCHR: "char_device",
    statmod.S_IFBLK: "block_device",
}


class LocalFs:
    def __init__(self, root: Path) -> None:
        self.root = root / "data"
        self.trash = root / "trash"
        self.root.mkdir(parents=True, exist_ok=True)
        self.trash.mkdir(exist_ok=True)
        self.quotas: dict[str, tuple[int | None, int | None]] = {}
        self.closed = False

    def _p(self, path: str) -> str:
        return str(self.root) + _abs(path)

    def _err(self, err: OSError, path: str) -> OSError:
        return type(err)(err.errno, err.strerror, path)

    def _wrap(self, path: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except OSError as err:
            raise self._err(err, path) from None

    def _stat(self, path: str, follow: bool) -> Stat:
        st = self._wrap(path, os.stat if follow else os.lstat, self._p(path))
        kind = _KINDS.get(statmod.S_IFMT(st.st_mode), "file")
        target = os.readlink(self._p(path)) if kind == "symlink" else ""
        return Stat(
            st.st_ino,
            kind,
            st.st_mode & 0o7777,
            st.st_uid,
            st.st_gid,
            st.st_nlink,
            st.st_size,
            st.st_atime_ns,
            st.st_mtime_ns,
            st.st_ctime_ns,
            target,
            chunk_size=1 << 20,
            stripe_size=1,
            chain_table_id=1,
            rdev=st.st_rdev,
        )

    def stat(self, path: str, follow_symlinks: bool = True) -> Stat:
        return self._stat(path, follow_symlinks)

    def lstat(self, path: str) -> Stat:
        return self._stat(path, False)

    def exists(self, path: str) -> bool:
        return os.path.lexists(self._p(path))

    def isdir(self, path: str) -> bool:
        return os.path.isdir(self._p(path))

    def isfile(self, path: str) -> bool:
        return os.path.isfile(self._p(path))

    def listdir(self, path: str) -> list[str]:
        return sorted(self._wrap(path, os.listdir, self._p(path)))

    def scandir(self, path: str) -> list[DirEntry]:
        base = path.rstrip("/")
        return [DirEntry(n, self.lstat(f"{base}/{n}")) for n in self.listdir(path)]

    def walk(self, top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        for here, dirs, files in os.walk(self._p(top)):
            yield "/" + os.path.relpath(here, self.root).removeprefix("."), dirs, files

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        self._wrap(path, os.mkdir, self._p(path), mode)

    def makedirs(self, path: str, mode: int = 0o755, exist_ok: bool = False) -> None:
        self._wrap(path, os.makedirs, self._p(path), mode, exist_ok)

    def create(self, path: str, mode: int = 0o644, exclusive: bool = False) -> Stat:
        flags = os.O_CREAT | os.O_WRONLY | (os.O_EXCL if exclusive else 0)
        os.close(self._wrap(path, os.open, self._p(path), flags, mode))
        return self.lstat(path)

    def remove(self, path: str) -> None:
        self._wrap(path, os.unlink, self._p(path))

    unlink = remove

    def rmdir(self, path: str) -> None:
        self._wrap(path, os.rmdir, self._p(path))

    def rmtree(self, path: str, trash: bool = True) -> str:
        self.lstat(path)
        if trash:
            entry = self.trash / uuid.uuid4().hex[:12]
            entry.mkdir()
            (entry / "origin").write_text(path)
            os.rename(self._p(path), entry / "item")
            return entry.name
        if os.path.isdir(self._p(path)) and not os.path.islink(self._p(path)):
            shutil.rmtree(self._p(path))
        else:
            self.remove(path)
        return ""

    def rename(self, src: str, dst: str) -> None:
        self._wrap(src, os.rename, self._p(src), self._p(dst))

    def symlink(self, target: str, link_path: str) -> None:
        self._wrap(link_path, os.symlink, target, self._p(link_path))

    def readlink(self, path: str) -> str:
        return str(self._wrap(path, os.readlink, self._p(path)))

    def link(self, existing: str, new_path: str) -> None:
        self._wrap(new_path, os.link, self._p(existing), self._p(new_path))

    def truncate(self, path: str, length: int) -> None:
        self._wrap(path, os.truncate, self._p(path), length)

    def chmod(self, path: str, mode: int, *, follow_symlinks: bool = True) -> None:
        if not follow_symlinks and os.path.islink(self._p(path)):  # Linux cannot chmod a symlink
            raise OSError(95, "Operation not supported", path)
        self._wrap(path, os.chmod, self._p(path), mode)

    def chown(self, path: str, uid: int, gid: int, *, follow_symlinks: bool = True) -> None:
        self._wrap(path, lambda: os.chown(self._p(path), uid, gid, follow_symlinks=follow_symlinks))

    def utime(self, path: str, ns: tuple[int, int] | None = None, *, follow_symlinks: bool = True) -> None:
        if ns is None:
            self._wrap(path, lambda: os.utime(self._p(path), follow_symlinks=follow_symlinks))
        else:
            self._wrap(path, lambda: os.utime(self._p(path), ns=ns, follow_symlinks=follow_symlinks))

    def mknod(self, path: str, mode: int = 0o600 | statmod.S_IFIFO, device: int = 0) -> Stat:
        self._wrap(path, os.mknod, self._p(path), mode, device)
        return self.lstat(path)

    def statfs(self, path: str | None = None) -> StatFs:
        return StatFs(1 << 40, 1 << 30, (1 << 40) - (1 << 30), 42)

    def du(self, path: str, on_error: Any = None) -> tuple[int, int]:
        total, inodes = 0, 0
        report = None if on_error is None else (lambda err: on_error(err.filename, err))
        for here, _dirs, files in os.walk(self._p(path), onerror=report):
            inodes += 1 + len(files)
            total += sum(os.lstat(os.path.join(here, f)).st_size for f in files)
        return total, inodes

    def _quota(self, path: str) -> Quota:
        max_bytes, max_inodes = self.quotas[path]
        used, inodes = self.du(path)
        return Quota(path, max_bytes, max_inodes, used, inodes)

    def get_quota(self, path: str) -> Quota | None:
        self.lstat(path)
        return self._quota(path) if path in self.quotas else None

    def set_quota(self, path: str, max_bytes: int | None = None, max_inodes: int | None = None) -> Quota:
        self.lstat(path)
        self.quotas[path] = (max_bytes or None, max_inodes or None)
        return self._quota(path)

    def list_quotas(self) -> list[Quota]:
        return [self._quota(p) for p in sorted(self.quotas)]

    def trash_list(self) -> list[TrashEntry]:
        return [
            TrashEntry(e.name, (e / "origin").read_text(), 0, 0, st.st_ino, statmod.S_ISDIR(st.st_mode))
            for e in sorted(self.trash.iterdir())
            for st in [(e / "item").lstat()]
        ]

    def trash_restore(self, entry_id: str) -> str:
        entry = self.trash / entry_id
        if not entry.exists():
            raise FileNotFoundError(2, "No such trash entry", entry_id)
        origin = (entry / "origin").read_text()
        os.rename(entry / "item", self._p(origin))
        shutil.rmtree(entry)
        return origin

    def trash_empty(self) -> int:
        entries = list(self.trash.iterdir())
        for e in entries:
            shutil.rmtree(e)
        return len(entries)

    def open(
        self,
        path: str,
        mode: str = "rb",
        *,
        buffering: int = -1,
        perm: int = 0o644,
        write_only: bool = False,
        writeback: bool | None = None,
    ) -> Any:
        if "b" not in mode:
            raise ValueError("binary modes only in this stand-in")
        if "x" in mode:  # created with ``perm`` and opened in one step, like the client
            os.close(self._wrap(path, os.open, self._p(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, perm))
            mode = mode.replace("x", "w")  # the file is new and empty: truncating it changes nothing
        raw = self._wrap(path, _Raw, self._p(path), mode.replace("b", ""))
        if buffering == 0:
            return raw
        if "r" in mode and "+" not in mode:
            return io.BufferedReader(raw)
        return _File(raw) if "+" in mode else _Writer(raw)

    def batch_stat(self, paths: list[str]) -> list[Stat | OSError]:
        out: list[Stat | OSError] = []
        for p in paths:
            try:
                out.append(self.stat(p))
            except OSError as err:
                out.append(err)
        return out

    def sync(self) -> None:
        """Nothing is written back here (the stand-in writes at once)."""

    def read_batch(self, reads: list[tuple[str, int, int]]) -> list[bytes]:
        out = []
        for path, offset, length in reads:
            with self.open(path, "rb") as f:
                f.seek(offset)
                out.append(f.read(length))
        return out

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def local_fs(tmp_path: Path) -> LocalFs:
    return LocalFs(tmp_path / "fs")
