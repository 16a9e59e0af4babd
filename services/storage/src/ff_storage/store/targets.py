"""The node's list of targets (id, chain, disk, folder), kept in one JSON file replaced atomically."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class TargetRecord:
    """One target as the targets file keeps it: its chain, the disk it is on and its folder."""

    target_id: int
    chain_id: int
    disk_index: int
    path: str


def load_targets(file: Path) -> list[TargetRecord]:
    """The targets ``file`` lists; none when it does not exist yet."""
    if not file.exists():
        return []
    return [TargetRecord(**item) for item in json.loads(file.read_text())]


def save_targets(file: Path, records: list[TargetRecord]) -> None:
    """Write to a temporary file, fsync it, rename over the old one, fsync the folder."""
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(file.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump([asdict(r) for r in sorted(records, key=lambda r: r.target_id)], f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(file)
    fd = os.open(file.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
