"""The FUSE mount's meta round trips, counted in the serving process (issue 16, small files): what a ``tar x`` file
and a SQLite transaction cost is mostly their number (``bench/hf3fs_mount_rpcs.py`` counts them the same way).
Needs /dev/fuse and fusermount3."""

from __future__ import annotations

import ctypes
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from hf3fs.fuse.options import DEFAULT_OPTIONS

from .conftest import FsCluster
from .test_fuse_mount import _mounted, _skip_reason

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")

_SYS_GETDENTS64 = 217  # x86_64

# The mount process's sitecustomize: every meta call counted by method; the counts written to counts.json when a
# file "dump" appears (libfuse's loop holds the main thread, so a thread watches).
_COUNTING = r"""
import collections, json, os, threading, time
from hf3fs import meta_client
out = os.environ["HF3FS_TEST_COUNT_DIR"]
counts = collections.Counter()
lock = threading.Lock()
class _Namer:  # the typed client's method (snake_case) -> the RPC's name in the proto
    def __getattr__(self, name):
        return "".join(part.title() for part in name.split("_"))
_call = meta_client.MetaClient.call
async def _counted(self, select, request, **kw):
    with lock:
        counts[select(_Namer())] += 1
    return await _call(self, select, request, **kw)
meta_client.MetaClient.call = _counted
def _watch():
    while True:
        if os.path.exists(os.path.join(out, "dump")):
            with lock:
                data = json.dumps(counts)
            with open(os.path.join(out, "counts.tmp"), "w") as f:
                f.write(data)
            os.replace(os.path.join(out, "counts.tmp"), os.path.join(out, "counts.json"))
            os.remove(os.path.join(out, "dump"))
        time.sleep(0.01)
threading.Thread(target=_watch, daemon=True).start()
"""


class Meter:
    """The mount's meta calls so far, by method."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def counts(self) -> Counter[str]:
        (self.folder / "dump").touch()
        deadline = time.monotonic() + 10
        while (self.folder / "dump").exists():
            assert time.monotonic() < deadline, "the mount's counter did not answer"
            time.sleep(0.01)
        return Counter(json.loads((self.folder / "counts.json").read_text()))


@pytest.fixture(scope="module")
def counted(fs_cluster: FsCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Meter]]:
    """``hf3fs mount --writeback`` whose meta calls are counted; yields its work folder and the meter."""
    folder = tmp_path_factory.mktemp("counts")
    (folder / "site").mkdir()
    (folder / "site" / "sitecustomize.py").write_text(_COUNTING)
    path = os.pathsep.join(p for p in (str(folder / "site"), os.environ.get("PYTHONPATH", "")) if p)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF3FS_TEST_COUNT_DIR", str(folder))
        mp.setenv("PYTHONPATH", path)
        # a new interpreter: the counting sitecustomize is read at interpreter start
        with _mounted(fs_cluster, tmp_path_factory.mktemp("countmnt"), "--writeback", fresh=True) as where:
            mp.undo()  # the mount process has its environment; the tests' own processes need none of it
            yield where, Meter(folder)


def _delta(meter: Meter, before: Counter[str]) -> dict[str, int]:
    return {k: v for k, v in (meter.counts() - before).items() if k != "RenewSessions"}


def test_unlink_and_rmdir_are_one_remove_each(counted: tuple[Path, Meter]) -> None:
    """No Stat before Remove (meta checks the type: the kernel already knew it); unlinking SQLite's journal paid
    one per transaction."""
    where, meter = counted
    work = where / "rm"
    work.mkdir()
    (work / "f").write_bytes(b"x")
    (work / "d").mkdir()
    before = meter.counts()
    os.unlink(work / "f")
    os.rmdir(work / "d")
    assert _delta(meter, before) == {"Remove": 2}
    assert os.listdir(work) == []


def test_fdatasync_and_close_within_the_length_meta_has_send_no_sync(
    counted: tuple[Path, Meter], fs_cluster: FsCluster
) -> None:
    """fdatasync (and close(2)) make the length exact on meta: a Sync only when the handle wrote past the length
    meta last gave it; bytes rewritten inside it are durable once storage acknowledged them (SQLite rewrites its
    journal's header and fdatasyncs it each transaction). fsync still sends one (the mtime is file metadata)."""
    where, meter = counted
    path = where / "sync.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"a" * 8192, 0)
        before = meter.counts()
        os.fdatasync(fd)  # grew: meta must know the length before fdatasync returns
        assert _delta(meter, before) == {"Sync": 1}
        remote = f"/fuse/{path.name}"
        assert fs_cluster.client.stat(remote).size == 8192

        os.pwrite(fd, b"header", 0)
        before = meter.counts()
        os.fdatasync(fd)
        assert _delta(meter, before) == {}
        with fs_cluster.client.open(remote, "rb") as f:  # another client: the bytes are there
            assert f.read() == b"header" + b"a" * 8186

        os.pwrite(fd, b"B", 1)
        before = meter.counts()
        os.fsync(fd)  # fsync: the mtime too
        assert _delta(meter, before) == {"Sync": 1}

        os.pwrite(fd, b"tail", 8192)
        before = meter.counts()
        os.fdatasync(fd)
        assert _delta(meter, before) == {"Sync": 1}
        assert fs_cluster.client.stat(remote).size == 8196

        os.pwrite(fd, b"C", 2)
    finally:
        before = meter.counts()
        os.close(fd)
    with fs_cluster.client.open(remote, "rb") as f:  # close-to-open: what was written before close is seen
        assert f.read() == b"hBC" + b"der" + b"a" * 8186 + b"tail"
    deadline = time.monotonic() + 10  # the release's Close comes after close(2) returned
    while "Close" not in (delta := _delta(meter, before)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert delta == {"Close": 1}, delta


def test_a_tar_style_file_chmod_ed_after_its_create_needs_no_set_attr(
    counted: tuple[Path, Meter], fs_cluster: FsCluster
) -> None:
    """tar x creates each file owner-only (O_WRONLY|O_CREAT|O_EXCL, 0600), writes it, fchmods it to its mode and
    closes it: on a --writeback mount the mode goes with the write-back's batched Create (meta chmods after its
    write check), not as a SetAttr per file; a mode without owner write too."""
    where, meter = counted
    folder = f"tar-{uuid.uuid4().hex[:8]}"  # (the session's cluster is shared: test_fuse_mount has a /fuse/tar)
    work = where / folder
    work.mkdir()
    before = meter.counts()
    for name, mode in (("a.py", 0o644), ("ro.py", 0o444)):
        fd = os.open(work / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, name.encode() * 100)
            os.fchmod(fd, mode)
            os.utime(fd, ns=(1_700_000_000 * 10**9, 1_700_000_000 * 10**9))
        finally:
            os.close(fd)
    deadline = time.monotonic() + 20
    while True:  # committed by the write-back after the close
        st = [fs_cluster.client.stat(f"/fuse/{folder}/{n}") for n in ("a.py", "ro.py")]
        if [s.size for s in st] == [400, 500] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [(s.size, s.mode, s.mtime_ns) for s in st] == [
        (400, 0o644, 1_700_000_000 * 10**9),
        (500, 0o444, 1_700_000_000 * 10**9),
    ]
    delta = _delta(meter, before)
    assert "SetAttr" not in delta and delta["Create"] == 2, delta
    assert [os.stat(work / n).st_mode & 0o7777 for n in ("a.py", "ro.py")] == [0o644, 0o444]


def test_a_burst_of_appends_takes_the_append_lease_once_and_an_idle_holder_gives_it_back(
    counted: tuple[Path, Meter], fs_cluster: FsCluster
) -> None:
    """O_APPEND through the mount takes meta's append lease for a burst of appends and gives it back, with the bytes
    in storage, at fsync, close or a moment after the burst (``hf3fs.fuse.appends.HOLD_S``). Each append took it
    and gave it back (an Open and a Close, and a durable chain write each): 300 log lines took 8 s. A handle left
    open after one append must not keep it: another client appends, and sees the line, without waiting."""
    where, meter = counted
    path = where / "appends.log"
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        before = meter.counts()
        for i in range(200):
            os.write(fd, f"line {i:04d}\n".encode())
        os.fsync(fd)
        delta = _delta(meter, before)
        # a burst of 200 in well under one HOLD_S on a quiet machine; a loaded one may give the lease back a few times
        assert delta.get("Open", 0) <= 20 and delta.get("Open", 0) == delta.get("Close", 0), delta
        remote = f"/fuse/{path.name}"
        assert fs_cluster.client.stat(remote).size == 200 * 10  # fsync gave the lease back with the end

        os.write(fd, b"idle line\n")  # then the handle goes quiet, still open
        time.sleep(1.0)  # far past HOLD_S: the mount gave the lease back with the line
        with fs_cluster.client.open(remote, "ab") as f:  # another client: its append lease is free at once
            f.write(b"other\n")
        with fs_cluster.client.open(remote, "rb") as f:
            tail = f.read()[-16:]
        assert tail == b"idle line\nother\n", tail
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(f"line {i:04d}\n".encode() for i in range(200)) + b"idle line\nother\n"


def test_ls_l_takes_the_attributes_from_the_listing_not_a_stat_per_name(
    counted: tuple[Path, Meter], fs_cluster: FsCluster
) -> None:
    """``ls -l`` (and ``find``, ``du``) of a folder: the listing's attributes reach the kernel with the names
    (readdirplus), so its lstat of each name needs no meta Stat; each was one (500 stats/s over 100k entries)."""
    where, meter = counted
    folder = f"lsl-{uuid.uuid4().hex[:8]}"
    client = fs_cluster.client
    client.makedirs(f"/fuse/{folder}/sub")
    for k in range(150):  # made by another client: nothing about them is cached in the mount or its kernel
        with client.open(f"/fuse/{folder}/f{k:03d}", "wb") as f:
            f.write(b"x" * k)
    before = meter.counts()
    listing = {e.name: e.stat(follow_symlinks=False) for e in os.scandir(where / folder)}  # as ls -l: names, lstat
    delta = _delta(meter, before)
    assert sorted(listing) == [f"f{k:03d}" for k in range(150)] + ["sub"]
    assert [listing[f"f{k:03d}"].st_size for k in range(150)] == list(range(150))
    assert os.path.isdir(where / folder / "sub") and listing["sub"].st_nlink == 2
    assert delta.get("Stat", 0) + delta.get("BatchStat", 0) <= 5, delta  # the folder itself, not its entries


def test_a_folder_of_many_pages_lists_every_name_once_and_a_file_written_here_shows_its_size(
    counted: tuple[Path, Meter], fs_cluster: FsCluster
) -> None:
    """Readdirplus pages (``serve._Fuse.readdir_fuse_3``): 2,500 names span many kernel pages, each asked from the
    offset the last ended at; every name comes once. A file this mount is writing shows the size written here, not
    the listing's (its entry carries no attributes, so the kernel asks getattr)."""
    where, _ = counted
    folder = f"pages-{uuid.uuid4().hex[:8]}"
    names = [f"{'n' * 40}{k:05d}" for k in range(2500)]  # long names: fewer per page
    fs_cluster.client.makedirs(f"/fuse/{folder}")
    for name in names:
        fs_cluster.client.create(f"/fuse/{folder}/{name}")
    fd = os.open(where / folder / names[7], os.O_WRONLY)
    try:
        os.write(fd, b"z" * 777)  # buffered in this mount's handle, not on meta yet
        listed = [(e.name, e.stat(follow_symlinks=False).st_size) for e in os.scandir(where / folder)]
    finally:
        os.close(fd)
    assert sorted(n for n, _ in listed) == names
    sizes = dict(listed)
    assert sizes[names[7]] == 777 and {s for n, s in listed if n != names[7]} == {0}


def test_a_folder_that_may_be_read_but_not_searched_lists_its_names(counted: tuple[Path, Meter]) -> None:
    """Read permission without search (0600 on a folder): its names list (meta gives no attributes without search
    permission, so the mount lists the names alone), and stat-ing an entry is refused, as on a local disk."""
    where, _ = counted
    folder = where / f"r-only-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    (folder / "inside").write_bytes(b"x")
    folder.chmod(0o600)
    try:
        assert os.listdir(folder) == ["inside"]
        with pytest.raises(PermissionError):
            os.stat(folder / "inside")
    finally:
        folder.chmod(0o755)


def _getdents_page(fd: int, size: int = 4096) -> list[str]:
    """The names one getdents64(2) of ``size`` bytes returns: a small page, as a program reading a folder in small
    steps asks (glibc's readdir asks up to 1 MiB at once, a whole folder of a few thousand names)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(size)
    got = libc.syscall(_SYS_GETDENTS64, fd, buf, size)
    if got < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    names, at = [], 0
    while at < got:
        reclen = int.from_bytes(buf.raw[at + 16 : at + 18], "little")
        names.append(buf.raw[at + 19 : at + reclen].split(b"\0", 1)[0].decode())
        at += reclen
    return [n for n in names if n not in (".", "..")]


def test_a_file_written_here_while_its_folder_is_being_listed_keeps_its_size(
    counted: tuple[Path, Meter], fs_cluster: FsCluster
) -> None:
    """A folder's listing is taken at its first page and its later pages are handed out from it: a file this mount
    opened and wrote after the first page must not reach the kernel with the listing's old size (the kernel takes it
    over the size it knows from the write: stat says 0 and a read sees an empty file)."""
    where, _ = counted
    folder = f"later-{uuid.uuid4().hex[:8]}"
    names = [f"{'m' * 40}{k:05d}" for k in range(300)]
    fs_cluster.client.makedirs(f"/fuse/{folder}")
    for name in names:
        fs_cluster.client.create(f"/fuse/{folder}/{name}")
    fd = os.open(where / folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        seen = _getdents_page(fd)  # the first page: the listing is taken now
        assert 0 < len(seen) < len(names) - 1
        with open(where / folder / names[-1], "wb") as f:
            f.write(b"w" * 777)
            f.flush()
            # as ls -l: an lstat per name, page by page (the kernel asks readdirplus for the next page)
            sizes = {n: os.lstat(where / folder / n).st_size for n in seen}
            while page := _getdents_page(fd):
                sizes.update((n, os.lstat(where / folder / n).st_size) for n in page)
            assert sorted(sizes) == names
            assert sizes[names[-1]] == 777
            assert os.stat(where / folder / names[-1]).st_size == 777
        assert (where / folder / names[-1]).read_bytes() == b"w" * 777
    finally:
        os.close(fd)


def test_a_later_page_of_a_listing_older_than_the_attribute_timeout_shows_what_another_client_wrote(
    counted: tuple[Path, Meter], fs_cluster: FsCluster
) -> None:
    """A program that reads a folder slowly (a backup: a page, then each file's work) gets its later pages from the
    listing taken at the first. Attributes older than the attribute timeout must not reach the kernel as fresh: a
    file another client wrote meanwhile showed the listing's size, 0, however old the listing was (rsync's size and
    mtime check would skip the changed file)."""
    where, _ = counted
    folder = f"slow-{uuid.uuid4().hex[:8]}"
    names = [f"{'s' * 40}{k:05d}" for k in range(300)]
    client = fs_cluster.client
    client.makedirs(f"/fuse/{folder}")
    for name in names:
        client.create(f"/fuse/{folder}/{name}")
    fd = os.open(where / folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        seen = _getdents_page(fd)  # the first page: the listing is taken now
        assert 0 < len(seen) < len(names) - 1
        sizes = {n: os.lstat(where / folder / n).st_size for n in seen}
        with client.open(f"/fuse/{folder}/{names[-1]}", "wb") as f:
            f.write(b"o" * 555)
        time.sleep(1.5 * DEFAULT_OPTIONS.attr_timeout_s)  # the listing is older than the attribute timeout now
        while page := _getdents_page(fd):
            sizes.update((n, os.lstat(where / folder / n).st_size) for n in page)
        assert sorted(sizes) == names
        assert sizes[names[-1]] == 555
    finally:
        os.close(fd)
