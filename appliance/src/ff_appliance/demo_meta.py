"""The file-system part of ``fireflyer demo``: files through hf3fs, a rename, a quota, the trash.

A tree and a file through hf3fs (meta for names, storage for bytes), a rename, a directory quota refusing a write, and a
recursive remove to the trash.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import time
from collections.abc import Callable, Sequence

import hf3fs

NUM_META_STEPS = 4
FILE_BYTES = 8 << 20
QUOTA_BYTES = 4 << 20


class MetaDemoError(Exception):
    """The file system did not behave as the demo expects."""


async def meta_section(
    addresses: Sequence[str], token: str, step: Callable[[str], None], say: Callable[[str], None]
) -> None:
    """Run the file-system steps with ``token`` (``step`` prints a title, ``say`` a result); hf3fs off the loop.

    Raises:
        MetaDemoError: a file read back differs, the quota let a write through, or the tree outlived its removal.
    """
    await asyncio.to_thread(_run, list(addresses), token, step, say)


def _run(addresses: list[str], token: str, step: Callable[[str], None], say: Callable[[str], None]) -> None:
    with hf3fs.connect(addresses, token) as fs:
        top = f"/demo/run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        step(f"hf3fs: create {top}/data and write a file of {FILE_BYTES >> 20} MiB, read it back")
        fs.makedirs(f"{top}/data/raw", exist_ok=True)
        payload = os.urandom(FILE_BYTES)
        with fs.open(f"{top}/data/raw/sample.bin", "wb") as f:
            f.write(payload)
        st = fs.stat(f"{top}/data/raw/sample.bin")
        say(
            f"inode {st.inode_id}: {st.size} bytes in chunks of {st.chunk_size >> 20} MiB over {st.stripe_size} "
            f"chains of table {st.chain_table_id}; meta holds the names, storage the bytes"
        )
        with fs.open(f"{top}/data/raw/sample.bin", "rb") as f:
            back = f.read()
        if back != payload:
            raise MetaDemoError("the file read back differs from what was written")
        say(f"read back byte-exact (sha256 {hashlib.sha256(back).hexdigest()[:16]}...)")

        step("hf3fs: rename the directory atomically and list the tree")
        fs.rename(f"{top}/data/raw", f"{top}/data/ready")
        for root, dirs, files in fs.walk(top):
            say(f"{root}: dirs {dirs} files {files}")

        step(f"hf3fs: a {QUOTA_BYTES >> 20} MiB directory quota refuses a write past it")
        fs.mkdir(f"{top}/limited")
        fs.set_quota(f"{top}/limited", max_bytes=QUOTA_BYTES)
        with fs.open(f"{top}/limited/a.bin", "wb") as f:
            f.write(payload[: 3 << 20])
        try:
            with fs.open(f"{top}/limited/b.bin", "wb") as f:
                f.write(payload[: 2 << 20])
        except OSError as exc:
            if exc.errno != errno.EDQUOT:
                raise
            say(f"refused: {errno.errorcode[exc.errno]}: {exc.strerror}")
        else:
            raise MetaDemoError("a write past the quota was accepted")
        quota = fs.get_quota(f"{top}/limited")
        size_b = fs.stat(f"{top}/limited/b.bin").size
        if quota is None or size_b != 0:
            raise MetaDemoError(f"quota missing or bytes written past it (b.bin has {size_b})")
        say(f"quota {quota.path}: {quota.used_bytes >> 20} of {QUOTA_BYTES >> 20} MiB used, b.bin has {size_b} bytes")

        step(f"hf3fs: remove {top} recursively to the trash, then empty it")
        trash_id = fs.rmtree(top)
        entry = next(e for e in fs.trash_list() if e.entry_id == trash_id)
        say(
            f"trash entry {trash_id[:12]}... holds {entry.original_path}, kept until "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(entry.expires_at_ns / 1e9))}"
        )
        fs.trash_empty([trash_id])
        if fs.exists(top):
            raise MetaDemoError(f"{top} still exists")
        say(
            "emptied: the files' chunks are freed in storage by meta's background GC, once every writable capability"
            " given out for them has expired (twice writable_capability_ttl_s: 10 minutes by default)"
        )
