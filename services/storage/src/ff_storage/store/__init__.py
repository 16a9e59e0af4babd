"""Disk: the chunk engine and the target registry of a node."""
