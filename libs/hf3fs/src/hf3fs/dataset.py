"""Map-style datasets over 3FS files, for data loaders (torch's ``DataLoader`` or any index sampler)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hf3fs.fs import WHOLE_FILE, FileSystem


class FileDataset:
    """Item ``i`` is the content of ``paths[i]`` (bytes), or ``transform(content)``.

    Picklable: DataLoader workers started with ``multiprocessing_context="spawn"`` or ``"forkserver"`` each
    receive the FileSystem's arguments and connect on their own (gRPC does not survive ``fork()``, see
    ``hf3fs.fs``). A batch (torch's ``__getitems__``) is one ``read_batch``: one metadata round trip and all
    its chunks in flight at once.

        fs = hf3fs.connect()
        data = FileDataset(fs, [f"/data/shard-{i:05d}" for i in range(1000)], transform=decode)
        loader = DataLoader(data, batch_size=32, num_workers=8, multiprocessing_context="forkserver")
    """

    def __init__(self, fs: FileSystem, paths: Sequence[str], transform: Callable[[bytes], Any] | None = None) -> None:
        self.fs = fs
        self.paths = list(paths)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        contents = self.fs.read_batch([(self.paths[i], 0, WHOLE_FILE) for i in indices])
        return contents if self.transform is None else [self.transform(c) for c in contents]
