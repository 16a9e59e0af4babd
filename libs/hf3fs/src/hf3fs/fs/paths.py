"""How the file system takes paths: absolute strings, sent to meta as a ``PathAt``."""

from __future__ import annotations

from fireflyer.meta.v1 import meta_pb2 as pb


def absolute(path: str) -> str:
    """``path`` itself, once checked to be an absolute str.

    Raises:
        TypeError: not a str.
        ValueError: not absolute.
    """
    if not isinstance(path, str):
        raise TypeError(f"path must be str, not {type(path).__name__}")
    if not path.startswith("/"):
        raise ValueError(f"hf3fs paths are absolute: {path!r}")
    return path


def path_at(path: str) -> pb.PathAt:
    """The ``PathAt`` naming ``path`` (checked by ``absolute``)."""
    return pb.PathAt(path=absolute(path))
