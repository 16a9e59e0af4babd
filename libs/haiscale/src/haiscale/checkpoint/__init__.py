"""HaiScale's checkpoint manager (the paper's section VII-A): sharded state saved to 3FS in the background.

Host snapshots, background batch writes to 3FS (or a local folder), an atomic manifest commit, the newest K kept,
sharded state that loads on any number of ranks, and the commit reported to the HAI scheduler. See
libs/haiscale/README.md.
"""

from __future__ import annotations

from haiscale.checkpoint.api import SaveHandle, latest_step, load, save, wait_for_saves
from haiscale.checkpoint.loader import CheckpointMismatch, CorruptCheckpoint, Loaded, UntrustedValues
from haiscale.checkpoint.manifest import MANIFEST, Shard
from haiscale.checkpoint.saver import CheckpointError

__all__ = [
    "MANIFEST",
    "CheckpointError",
    "CheckpointMismatch",
    "CorruptCheckpoint",
    "Loaded",
    "SaveHandle",
    "Shard",
    "UntrustedValues",
    "latest_step",
    "load",
    "save",
    "wait_for_saves",
]
