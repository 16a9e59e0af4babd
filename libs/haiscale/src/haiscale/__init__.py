"""HaiScale: data-parallel training over hfreduce, and a checkpoint manager on 3FS."""

from __future__ import annotations
