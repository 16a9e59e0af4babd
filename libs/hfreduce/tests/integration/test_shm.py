"""Shared-memory segments ask the kernel for huge pages, and get them wherever its policy allows."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hfreduce.shm import Segment, huge_pages

POLICY = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
SEGMENT_BYTES = 8 << 20


def mapping_of(arr: np.ndarray) -> dict[str, str]:
    """The /proc/self/smaps entry of the mapping that holds ``arr``."""
    addr = arr.__array_interface__["data"][0]
    entry: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            if inside:
                break
            inside = int(head.group(1), 16) <= addr < int(head.group(2), 16)
        elif inside:
            key, _, value = line.partition(":")
            entry[key] = value.strip()
    assert entry, "no mapping holds the array"
    return entry


@contextlib.contextmanager
def shared_policy(mode: str) -> Iterator[None]:
    """The machine-wide policy set to ``mode`` for a moment (it governs only mappings that ask, under
    ``advise``), and put back."""
    old = huge_pages()
    POLICY.write_text(mode)
    try:
        yield
    finally:
        POLICY.write_text(old)


@pytest.mark.skipif(not POLICY.exists(), reason="this kernel has no transparent huge pages")
def test_a_segment_asks_for_huge_pages_whatever_the_policy() -> None:
    seg = Segment.create("hfreduce-test-hg", SEGMENT_BYTES)
    try:
        arr = seg.array(np.uint8, SEGMENT_BYTES)
        assert "hg" in mapping_of(arr)["VmFlags"].split()
        assert huge_pages() in {"always", "within_size", "advise", "never", "deny", "force"}
        del arr
    finally:
        seg.close()


@pytest.mark.skipif(
    not POLICY.exists() or os.geteuid() != 0 or not os.access(POLICY, os.W_OK),
    reason="setting the kernel's huge-page policy needs root and transparent huge pages",
)
def test_under_the_advise_policy_segments_are_mapped_with_huge_pages() -> None:
    with shared_policy("advise"):
        seg = Segment.create("hfreduce-test-huge", SEGMENT_BYTES)
        try:
            arr = seg.array(np.float32, SEGMENT_BYTES // 4)
            arr[:] = 1.5  # data stays right on huge pages
            assert float(arr.sum(dtype=np.float64)) == 1.5 * len(arr)
            huge_kib = int(mapping_of(arr)["ShmemPmdMapped"].split()[0])
            assert huge_kib >= SEGMENT_BYTES // 1024 // 2, mapping_of(arr)
            del arr
        finally:
            seg.close()
    with shared_policy("deny"):  # the one policy that refuses huge pages to everyone, collapse included
        seg = Segment.create("hfreduce-test-small", SEGMENT_BYTES)
        try:
            arr = seg.array(np.uint8, SEGMENT_BYTES)
            assert mapping_of(arr)["ShmemPmdMapped"].startswith("0 ")
            del arr
        finally:
            seg.close()


@pytest.mark.skipif(
    not POLICY.exists() or os.geteuid() != 0 or not os.access(POLICY, os.W_OK),
    reason="setting the kernel's huge-page policy needs root and transparent huge pages",
)
@pytest.mark.skipif(tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2]) < (6, 1), reason="Linux < 6.1")
@pytest.mark.parametrize(
    "nbytes", [SEGMENT_BYTES, SEGMENT_BYTES + 4096]
)  # the second is mapped off its reservation's start
def test_under_the_never_policy_huge_segments_are_collapsed_for_every_process(nbytes: int) -> None:
    """``never`` is what many kernels ship: a segment created ``huge`` (registered buffers) is still moved into
    huge pages by its creator (MADV_COLLAPSE), and another mapping of it (another process attaching it) maps those
    huge pages; its data survives a collapse."""
    whole = nbytes // 1024 // 2048 * 2048  # KiB in whole huge pages
    with shared_policy("never"):
        seg = Segment.create("hfreduce-test-collapse", nbytes, huge=True)
        other = Segment.attach(os.dup(seg.fd), nbytes)
        try:
            arr, seen = seg.array(np.uint8, nbytes), other.array(np.uint8, nbytes)
            for view in (arr, seen):  # collapsed at creation: the attached mapping faulted huge pages in
                assert int(mapping_of(view)["ShmemPmdMapped"].split()[0]) >= whole // 2, mapping_of(view)
            values = np.arange(nbytes // 4, dtype=np.float32)
            seg.array(np.float32, nbytes // 4)[:] = values
            seg.collapse()  # again, with data in it
            assert np.array_equal(other.array(np.float32, nbytes // 4), values)
            with pytest.raises(ValueError, match="past"):
                seg.array(np.uint8, nbytes + 1)  # the mapping's reservation is longer; the segment is not
            del arr, seen
        finally:
            other.close()
            seg.close()


def test_a_segment_that_is_not_huge_is_not_collapsed() -> None:
    seg = Segment.create("hfreduce-test-plain", SEGMENT_BYTES)
    try:
        arr = seg.array(np.uint8, SEGMENT_BYTES)
        if huge_pages() in {"never", "deny"}:  # nothing but a collapse could have given it huge pages
            assert mapping_of(arr)["ShmemPmdMapped"].startswith("0 ")
        with pytest.raises(ValueError):
            seg.array(np.uint8, -1)
        del arr
    finally:
        seg.close()
