"""FIFOs, sockets and device nodes made through the client on a real cluster: the device number is the inode's
own (not borrowed from another field), and only root (an admin) makes devices."""

from __future__ import annotations

import errno
import os
import stat

import pytest

import hf3fs

from .conftest import FsCluster


def test_device_numbers_are_kept_and_only_root_makes_devices(fs_cluster: FsCluster) -> None:
    admin = hf3fs.connect(mgmtd=fs_cluster.mgmtd, token=fs_cluster.admin_token)
    try:
        admin.makedirs("/ffs/special", exist_ok=True)
        admin.chmod("/ffs/special", 0o777)
        dev = os.makedev(259, 7)
        made = admin.mknod("/ffs/special/blk", 0o640 | stat.S_IFBLK, dev)
        fifo = admin.mknod("/ffs/special/fifo", 0o644 | stat.S_IFIFO)
        big = os.makedev(0xFFF, 0x7FFFFFFF)  # a 44-bit device number, past 32 bits
        admin.mknod("/ffs/special/chr", 0o600 | stat.S_IFCHR, big)
    finally:
        admin.close()
    user = fs_cluster.client
    assert (made.rdev, stat.S_ISBLK(made.st_mode)) == (dev, True)
    seen = user.stat("/ffs/special/blk")
    assert (seen.rdev, stat.S_ISBLK(seen.st_mode), seen.size) == (dev, True, 0)
    assert (os.major(seen.rdev), os.minor(seen.rdev)) == (259, 7)
    assert user.stat("/ffs/special/chr").rdev == big
    assert (fifo.rdev, user.stat("/ffs/special/fifo").rdev) == (0, 0)
    with pytest.raises(OSError) as refused:
        user.mknod("/ffs/special/mine", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    assert refused.value.errno == errno.EPERM
    assert not user.exists("/ffs/special/mine")
    with pytest.raises(OSError) as bad:
        user.mknod("/ffs/special/f2", 0o600 | stat.S_IFIFO, os.makedev(1, 3))  # a FIFO has no device number
    assert bad.value.errno == errno.EINVAL
