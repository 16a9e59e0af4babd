"""fsspec's own conformance suite (``fsspec.tests.abstract``, which s3fs and gcsfs run too) on hf3fs over the real
cluster: copy, get, put, open and pipe, with every scenario built in a fresh folder of its own."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable

import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

from hf3fs.fsspec_fs import Hf3fsFileSystem

from .conftest import FsCluster


class Hf3fsFixtures(AbstractFixtures):  # type: ignore[misc]  # fsspec is untyped
    @pytest.fixture
    def fs(self, fs_cluster: FsCluster) -> Hf3fsFileSystem:
        return Hf3fsFileSystem(fs=fs_cluster.client)

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return posixpath.join

    @pytest.fixture
    def fs_path(self, fs: Hf3fsFileSystem) -> str:
        """A new folder per test; not removed after it (the cluster, and all of it, goes with the module), which
        saved a recursive remove of every scenario's files per test."""
        path = f"/ffs/abstract/{uuid.uuid4().hex[:12]}"
        fs.makedirs(path, exist_ok=True)
        return path


class TestHf3fsCopy(AbstractCopyTests, Hf3fsFixtures):  # type: ignore[misc]
    pass


class TestHf3fsGet(AbstractGetTests, Hf3fsFixtures):  # type: ignore[misc]
    pass


class TestHf3fsPut(AbstractPutTests, Hf3fsFixtures):  # type: ignore[misc]
    pass


class TestHf3fsOpen(AbstractOpenTests, Hf3fsFixtures):  # type: ignore[misc]
    pass


class TestHf3fsPipe(AbstractPipeTests, Hf3fsFixtures):  # type: ignore[misc]
    pass
