"""Run by test_checkpoint_3fs.py: commits checkpoint 1, then SIGKILLs itself at one moment of saving checkpoint 2.

    python checkpoint_crash_worker.py ROOT STAGE      (ROOT: hf3fs:///... or a folder; FF_MGMTD_ADDRESSES, FF_TOKEN)

STAGE: ``snapshot`` (the snapshot taken, the folder made and the save's lease taken, nothing written),
``data`` (half of rank 0's data file written), ``manifest`` (the manifest written under its temporary
name, not yet renamed), ``prune`` (checkpoint 2 committed, checkpoint 1's manifest removed, its files not yet).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import torch

from haiscale import checkpoint as ckpt
from haiscale.checkpoint import saver, storage
from haiscale.checkpoint.storage import Piece


def state(value: float) -> dict[str, Any]:
    return {f"t{i}": torch.full((1 << 16,), value) for i in range(4)} | {"step": int(value)}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(stage: str) -> None:
    """Make the storage classes kill this process at ``stage``."""
    for cls in (storage.LocalStorage, storage.Hf3fsStorage):
        write_file, write_atomic, remove_tree = cls.write_file, cls.write_atomic, cls.remove_tree

        def half_then_die(self: Any, path: str, pieces: Sequence[Piece], _orig: Any = write_file) -> None:
            _orig(self, path, pieces[: len(pieces) // 2] if path.endswith(".bin") else pieces)
            if path.endswith(".bin"):
                die()

        def tmp_then_die(self: Any, path: str, data: bytes, _orig: Any = write_atomic) -> None:
            if path.endswith(ckpt.MANIFEST):
                self.write_file(f"{path}.tmp-crash", [(0, memoryview(data))])
                die()
            _orig(self, path, data)

        def die_instead(self: Any, path: str, _orig: Any = remove_tree) -> None:
            die()

        if stage == "data":
            cls.write_file = half_then_die  # type: ignore[method-assign]
        elif stage == "manifest":
            cls.write_atomic = tmp_then_die  # type: ignore[method-assign]
        elif stage == "prune":
            cls.remove_tree = die_instead  # type: ignore[method-assign]


def main() -> None:
    root, stage = sys.argv[1], sys.argv[2]
    ckpt.save(root, state(1.0), step=1, blocking=True)
    if stage == "snapshot":
        saver.write_rank = lambda *args, **kw: die()  # type: ignore[assignment]
    arm(stage)
    ckpt.save(root, state(2.0), step=2, keep=1, blocking=True)
    sys.exit(3)  # not reached: the process is killed inside the save


if __name__ == "__main__":
    main()
