"""fsspec filesystem for 3FS, protocols ``hf3fs`` and ``3fs``: pandas, pyarrow, dask and torch use ``hf3fs://`` paths.

``pd.read_parquet("hf3fs:///data/x.parquet", storage_options={"mgmtd": "host:port", "token": "fft_..."})``;
without storage options the cluster comes from ``FF_MGMTD_ADDRESSES`` and ``FF_TOKEN``. Registered through the
``fsspec.specs`` entry points of this package (and by importing this module). fsspec and pandas see a protocol
only in a URL (``scheme://``): the short ``hf3fs:/a/b`` of the ``hf3fs`` command is a local path to them.
"""

from __future__ import annotations

import atexit
import datetime
import errno
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from typing import IO, Any, TypeVar

import fsspec
from fsspec.spec import AbstractFileSystem

import hf3fs
from hf3fs import uri

T = TypeVar("T")
COPY_BLOCK_BYTES = 8 << 20
_OPEN_MODES = {"rb", "wb", "ab", "xb", "r+b", "rb+", "w+b", "wb+", "a+b", "ab+"}


_connections: dict[tuple[tuple[str, ...], str], Any] = {}
_connections_lock = threading.Lock()


def _shared_connection(mgmtd: str | Sequence[str] | None, token: str | None) -> Any:
    """One client per cluster and token in a process, shared by fsspec's instances (one per thread).

    The client is thread-safe and owns a loop thread and channels, so they share it.
    """
    addresses = tuple(a.strip() for a in (mgmtd.split(",") if isinstance(mgmtd, str) else mgmtd or ()) if a.strip())
    key = (addresses, token or "")
    with _connections_lock:
        if key not in _connections:
            if not addresses and not token:
                _connections[key] = hf3fs.connect()
            else:
                _connections[key] = hf3fs.connect(mgmtd=list(addresses) or None, token=token)
            if len(_connections) == 1:
                atexit.register(_close_connections)
        return _connections[key]


def _close_connections() -> None:
    with _connections_lock:
        for client in _connections.values():
            client.close()
        _connections.clear()


def _kind(st: Any) -> str:
    return "directory" if st.type == "directory" else "file" if st.type == "file" else "other"


class Hf3fsFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec is untyped
    """3FS through fsspec.

    Args:
        mgmtd: mgmtd address(es), ``"host:port"``, ``"a:1,b:2"`` or a list; default ``FF_MGMTD_ADDRESSES``.
        token: the user's token; default ``FF_TOKEN``.
        use_trash: ``rm(recursive=True)`` moves trees to the 3FS trash instead of deleting them.
        auto_mkdir: opening a file for writing creates its missing parent directories (as object stores
            behave; pandas and pyarrow write to new folders without making them first).
        fs: an already connected :class:`hf3fs.FileSystem` to use (then mgmtd and token are ignored).
    """

    protocol = uri.SCHEMES
    root_marker = "/"

    def __init__(
        self,
        mgmtd: str | Sequence[str] | None = None,
        token: str | None = None,
        use_trash: bool = False,
        auto_mkdir: bool = True,
        fs: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.client = fs if fs is not None else _shared_connection(mgmtd, token)
        self.use_trash, self.auto_mkdir = use_trash, auto_mkdir

    # ---- paths ----

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = os.fspath(path)
        if not uri.has_scheme(text) and not text.startswith("/"):
            text = "/" + text  # fsspec hands over "a/b" for "hf3fs://a/b" in some code paths
        return uri.strip_scheme(text).rstrip("/") or "/"

    def unstrip_protocol(self, name: str) -> str:
        """``name`` as an ``hf3fs:///...`` URL."""
        return uri.to_url(name)

    # ---- metadata ----

    def _entry(self, path: str, st: Any) -> dict[str, Any]:
        return {
            "name": path,
            "size": st.size,
            "type": _kind(st),
            "islink": st.type == "symlink",
            "mode": st.st_mode,
            "uid": st.uid,
            "gid": st.gid,
            "nlink": st.nlink,
            "ino": st.inode_id,
            "mtime": st.mtime_ns / 1e9,
            "created": st.ctime_ns / 1e9,
            **({"destination": st.symlink_target} if st.type == "symlink" else {}),
        }

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """The entry for ``path`` (name, size, type, mode, owner, times); a symlink is followed, a dangling one kept."""
        path = self._strip_protocol(path)
        lst = self.client.lstat(path)
        if lst.type != "symlink":
            return self._entry(path, lst)
        try:
            entry = self._entry(path, self.client.stat(path))
        except FileNotFoundError:  # a dangling link is still an entry
            entry = self._entry(path, lst)
        entry["islink"], entry["destination"] = True, lst.symlink_target
        return entry

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """A folder's entries (``detail``: with their info, from one listing with stats); a file lists as itself."""
        path = self._strip_protocol(path)
        if not self.client.isdir(path):
            return [self.info(path)] if detail else [path]
        prefix = path.rstrip("/")
        if not detail:
            return [f"{prefix}/{name}" for name in self.client.listdir(path)]
        return [self._entry(f"{prefix}/{e.name}", e.stat) for e in self.client.scandir(path)]

    def exists(self, path: str, **kwargs: Any) -> bool:
        """True when ``path`` resolves, following symlinks (a dangling link does not exist)."""
        return bool(self.client.exists(self._strip_protocol(path)))

    def isdir(self, path: str) -> bool:
        """True for a folder or a symlink to one."""
        return bool(self.client.isdir(self._strip_protocol(path)))

    def isfile(self, path: str) -> bool:
        """True for a regular file or a symlink to one."""
        return bool(self.client.isfile(self._strip_protocol(path)))

    def created(self, path: str) -> datetime.datetime:
        """The inode's ctime, as 3FS has no birth time (UTC)."""
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.UTC)

    def modified(self, path: str) -> datetime.datetime:
        """The mtime (UTC)."""
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.UTC)

    # ---- directories and names ----

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Makes a folder (and its parents when ``create_parents``); FileExistsError when ``path`` exists."""
        path = self._strip_protocol(path)
        if self.client.exists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        if create_parents:
            self.client.makedirs(path, exist_ok=True)
        else:
            self.client.mkdir(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Makes a folder and its missing parents; FileExistsError when it exists, unless ``exist_ok``."""
        self.client.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path: str) -> None:
        """Removes an empty folder."""
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path: str) -> None:
        """Removes a file or symlink."""
        self.client.remove(self._strip_protocol(path))

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Removes files, or trees with ``recursive``: a whole tree in one meta call (to the trash with ``use_trash``).

        With ``maxdepth``, fsspec's walk removes what it lists. Without ``recursive`` a folder is IsADirectoryError.
        """
        paths = path if isinstance(path, list) else [path]
        for one in paths:
            p = self._strip_protocol(one)
            if recursive and maxdepth is None and self.client.isdir(p):
                self.client.rmtree(p, trash=self.use_trash)
            elif not recursive:
                if self.client.lstat(p).type == "directory":
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), p)
                self.client.remove(p)
            else:
                super().rm(p, recursive=recursive, maxdepth=maxdepth)

    def mv(self, path1: str, path2: str, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        """A rename in meta: atomic, and a whole tree at once (``recursive`` and ``maxdepth`` do not matter)."""
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if src != dst:
            self.client.rename(src, dst)  # atomic, and a whole tree at once

    def rename(self, path1: str, path2: str, **kwargs: Any) -> None:
        """The same as ``mv``."""
        self.mv(path1, path2)

    # ---- data ----

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> IO[bytes]:
        if mode not in _OPEN_MODES:
            raise ValueError(f"unsupported mode {mode!r} for {path}")
        if not autocommit:
            raise NotImplementedError("hf3fs does not stage writes in transactions (autocommit=False)")
        buffering = block_size if block_size and block_size > 0 else -1
        path = self._strip_protocol(path)
        if mode.startswith("r"):
            f: IO[bytes] = self.client.open(path, mode, buffering=buffering)
            return f
        return self._making_parent(path, lambda: self.client.open(path, mode, buffering=buffering))

    def _making_parent(self, path: str, create: Callable[[], T]) -> T:
        """``create()`` (which makes ``path``); with ``auto_mkdir``, a missing parent folder is made and it runs again.

        No extra call when the parent exists.
        """
        try:
            return create()
        except FileNotFoundError:
            parent = self._parent(path)
            if not self.auto_mkdir or self.client.exists(parent):
                raise
            self.client.makedirs(parent, exist_ok=True)
            return create()

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """The file's bytes, or those of ``[start, end)`` (negative: from the end), read in one ranged read."""
        path = self._strip_protocol(path)
        if start is None and end is None:
            with self.client.open(path, "rb") as f:
                return bytes(f.read())
        size = int(self.client.stat(path).size)
        begin = max(0, size + start if start is not None and start < 0 else start or 0)
        stop = size if end is None else min(size, size + end if end < 0 else end)
        if stop <= begin:
            return b""
        data: bytes = self.client.read_batch([(path, begin, stop - begin)])[0]
        return data

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Writes ``value`` as the whole file (``mode="create"``: FileExistsError if it exists); see ``auto_mkdir``."""
        path = self._strip_protocol(path)
        open_mode = "xb" if mode == "create" else "wb"
        with self._making_parent(path, lambda: self.client.open(path, open_mode)) as f:
            f.write(value)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copies a file within 3FS (a folder: makes it); parents of ``path2`` as ``auto_mkdir``."""
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        try:  # a folder is refused by the Open itself: no Stat first
            fin = self.client.open(src, "rb", buffering=0)  # unbuffered: each block straight into the copy's buffer
        except IsADirectoryError:
            self.client.makedirs(dst, exist_ok=True)
            return
        with fin, self._making_parent(dst, lambda: self.client.open(dst, "wb")) as fout:
            shutil.copyfileobj(fin, fout, COPY_BLOCK_BYTES)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        """Creates an empty file; an existing one is emptied (``truncate``) or gets both times set to now."""
        path = self._strip_protocol(path)
        try:  # a new file in one meta call
            self._making_parent(path, lambda: self.client.create(path, exclusive=True))
            return
        except FileExistsError:
            pass
        if not self.client.exists(path):  # the name is taken by a dangling symlink: create through it
            self._making_parent(path, lambda: self.client.create(path))
        elif truncate:
            self.client.truncate(path, 0)
        else:
            now = datetime.datetime.now(tz=datetime.UTC).timestamp()
            self.client.utime(path, ns=(int(now * 1e9), int(now * 1e9)))


def register() -> None:
    """Make ``hf3fs://`` and ``3fs://`` known to fsspec in this process (entry points do it for installed copies)."""
    for scheme in uri.SCHEMES:
        fsspec.register_implementation(scheme, Hf3fsFileSystem, clobber=True)


register()
