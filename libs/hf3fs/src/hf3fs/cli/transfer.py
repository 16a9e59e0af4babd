"""``hf3fs cp``: copy files and trees between the local disk and 3FS (either way, or within 3FS)."""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, TextIO

from hf3fs.cli.render import format_size
from hf3fs.writeback import WritebackError

BLOCK_BYTES = 8 << 20
_REDRAW_S = 0.2


@dataclass(frozen=True)
class Endpoint:
    """A path on one side: ``remote`` for 3FS, else the local file system."""

    path: str
    remote: bool

    def child(self, name: str) -> Endpoint:
        """The path ``name`` inside this one, on the same side."""
        join = posixpath.join if self.remote else os.path.join
        return Endpoint(join(self.path, name), self.remote)

    def __str__(self) -> str:
        return f"hf3fs:{self.path}" if self.remote else self.path


class Progress:
    """A one-line progress bar on a terminal stream: bytes done of total, percent, rate."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream, self.enabled = stream, enabled
        self.total = self.done_bytes = 0
        self.started = time.monotonic()
        self._drawn = 0.0

    def add_total(self, num_bytes: int) -> None:
        """Adds ``num_bytes`` to what the bar counts toward (as the copy is planned)."""
        self.total += num_bytes

    def advance(self, num_bytes: int) -> None:
        """Counts ``num_bytes`` more done; redraws at most every 0.2 s."""
        self.done_bytes += num_bytes
        now = time.monotonic()
        if self.enabled and now - self._drawn >= _REDRAW_S:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done_bytes / max(now - self.started, 1e-6)
        pct = 100 * self.done_bytes // self.total if self.total else 100
        width = 30
        filled = width * pct // 100
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {pct:3d}% "
            f"{format_size(self.done_bytes, True)}/{format_size(self.total, True)} {format_size(int(rate), True)}/s "
        )
        self.stream.flush()

    def done(self) -> None:
        """Draws the bar a last time and ends its line."""
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()


@dataclass(frozen=True)
class _Step:
    kind: str  # "dir" | "file" | "link"
    src: Endpoint
    dst: Endpoint
    size: int = 0
    target: str = ""


class Copier:
    """Plans a copy (so the progress bar knows the total), then runs it; failures go to ``on_error``.

    With ``writeback`` small files copied into 3FS are written back (``hf3fs.writeback``): committed in batches,
    and at the end of ``copy``, whose deferred failures go to ``on_error`` like the others (a file this copy
    would have created is then not there, or removed).
    """

    def __init__(
        self, fs: Any, progress: Progress, on_error: Callable[[str, BaseException], None], *, writeback: bool = False
    ) -> None:
        self.fs, self.progress, self.on_error = fs, progress, on_error
        self.writeback = writeback
        self._existing: set[str] = set()  # 3FS destination files there before the copy (write-back only)
        self._created: set[str] = set()  # 3FS files written back that this copy makes

    # ---- one side or the other ----

    def _lstat(self, ep: Endpoint) -> tuple[str, int, int, str]:
        """(kind, size, mode, symlink target) without following a symlink."""
        if ep.remote:
            st = self.fs.lstat(ep.path)
            return st.type, st.size, st.mode, st.symlink_target
        st_local = os.lstat(ep.path)
        if os.path.islink(ep.path):
            return "symlink", 0, 0o777, os.readlink(ep.path)
        kind = "directory" if os.path.isdir(ep.path) else "file"
        return kind, st_local.st_size, st_local.st_mode & 0o7777, ""

    def _stat_follow(self, ep: Endpoint) -> tuple[str, int, int]:
        if ep.remote:
            st = self.fs.stat(ep.path)
            return st.type, st.size, st.mode
        st_local = os.stat(ep.path)
        return ("directory" if os.path.isdir(ep.path) else "file"), st_local.st_size, st_local.st_mode & 0o7777

    def is_dir(self, ep: Endpoint) -> bool:
        """Whether ``ep`` is a folder (following a symlink), on its side; False when it does not exist."""
        return bool(self.fs.isdir(ep.path)) if ep.remote else os.path.isdir(ep.path)

    def _names(self, ep: Endpoint) -> list[str]:
        return list(self.fs.listdir(ep.path)) if ep.remote else sorted(os.listdir(ep.path))

    def _open(self, ep: Endpoint, mode: str) -> IO[bytes]:
        f: IO[bytes] = self.fs.open(ep.path, mode) if ep.remote else open(ep.path, mode)  # noqa: SIM115
        return f

    def _makedirs(self, ep: Endpoint) -> None:
        if ep.remote:
            self.fs.makedirs(ep.path, exist_ok=True)
        else:
            os.makedirs(ep.path, exist_ok=True)

    def _symlink(self, target: str, ep: Endpoint) -> None:
        if ep.remote:
            self.fs.symlink(target, ep.path)
        else:
            os.symlink(target, ep.path)

    # ---- plan and run ----

    def _plan(self, src: Endpoint, dst: Endpoint, recursive: bool) -> Iterator[_Step]:
        kind, size, _ = self._stat_follow(src)  # the operands themselves are followed, like cp
        if kind != "directory":
            yield _Step("file", src, dst, size)
            return
        if not recursive:
            raise IsADirectoryError(errno.EISDIR, "use cp -r", str(src))
        stack = [(src, dst)]
        while stack:
            s, d = stack.pop()
            yield _Step("dir", s, d)
            for name in self._names(s):
                sc, dc = s.child(name), d.child(name)
                kind, size, _, target = self._lstat(sc)
                if kind == "directory":
                    stack.append((sc, dc))
                elif kind == "symlink":
                    yield _Step("link", sc, dc, target=target)
                else:
                    yield _Step("file", sc, dc, size)

    def copy(self, src: Endpoint, dst: Endpoint, recursive: bool) -> None:
        """Copies ``src`` to ``dst`` (a tree if ``recursive``); a failure goes to ``on_error``, the rest goes on."""
        try:
            steps = list(self._plan(src, dst, recursive))
        except OSError as err:
            self.on_error(str(src), err)
            return
        for step in steps:
            self.progress.add_total(step.size)
        if self.writeback and dst.remote:
            self._existing = self._remote_files([s.dst.path for s in steps if s.kind == "file"])
        try:
            for step in steps:
                try:
                    self._run(step)
                except OSError as err:
                    failed = err.filename if isinstance(err.filename, str) else str(step.dst)
                    self.on_error(failed, err)
                    if step.kind == "dir":
                        return  # nothing below can be copied
        finally:
            self._commit()

    def _remote_files(self, paths: list[str]) -> set[str]:
        """Which of ``paths`` exist in 3FS (one BatchStat per 1,000)."""
        found: set[str] = set()
        for k in range(0, len(paths), 1000):
            part = paths[k : k + 1000]
            found.update(p for p, st in zip(part, self.fs.batch_stat(part), strict=True) if not isinstance(st, OSError))
        return found

    def _commit(self) -> None:
        """The written-back files committed; each that failed reported (and removed if this copy made it)."""
        if not self.writeback:
            return
        try:
            self.fs.sync()
        except WritebackError as err:
            for path, why in err.failures:
                self.on_error(path, why)
                if path in self._created:
                    self._remove_quietly(Endpoint(path, remote=True))
        self._created.clear()

    def _run(self, step: _Step) -> None:
        if step.kind == "dir":
            self._makedirs(step.dst)
        elif step.kind == "link":
            self._symlink(step.target, step.dst)
        else:
            self._copy_file(step.src, step.dst)

    def _copy_file(self, src: Endpoint, dst: Endpoint) -> None:
        """Copy one file; a file this copy created is removed again when the copy fails.

        Failures are going over quota or a read error: a failed ``cp`` leaves no empty or partial file behind.
        """
        with self._open(src, "rb") as fin:
            fout, created = self._create(dst)
            try:
                with fout:
                    while block := fin.read(BLOCK_BYTES):
                        fout.write(block)
                        self.progress.advance(len(block))
            except BaseException:
                if created:
                    self._remove_quietly(dst)
                raise

    def _create(self, ep: Endpoint) -> tuple[IO[bytes], bool]:
        """``ep`` opened for writing, and whether this made it (one create either way; none with write-back)."""
        if ep.remote and self.writeback:
            created = ep.path not in self._existing
            if created:
                self._created.add(ep.path)
            f: IO[bytes] = self.fs.open(ep.path, "wb", writeback=True)
            return f, created
        try:
            return self._open(ep, "xb"), True
        except FileExistsError:
            return self._open(ep, "wb"), False

    def _remove_quietly(self, ep: Endpoint) -> None:
        with contextlib.suppress(OSError):
            if ep.remote:
                self.fs.remove(ep.path)
            else:
                os.unlink(ep.path)
