"""How 3FS paths are written outside the client API: ``hf3fs:/a/b``, ``hf3fs:///a/b``, ``hf3fs://a/b``, ``3fs:/a/b``.

``hf3fs:///a/b`` is a URL, as fsspec and pandas take it; ``hf3fs://a/b`` is the same, the first name in the
URL's host part; ``3fs:/a/b`` is the short form.
"""

from __future__ import annotations

import posixpath

SCHEMES = ("hf3fs", "3fs")
PROTOCOL = "hf3fs"


def has_scheme(text: str) -> bool:
    """Whether ``text`` names a 3FS path (starts with ``hf3fs:`` or ``3fs:``)."""
    return any(text.startswith(f"{scheme}:") for scheme in SCHEMES)


def strip_scheme(text: str) -> str:
    """The absolute 3FS path of ``text`` (a 3FS URL or a plain absolute path), normalized.

    Raises:
        ValueError: the path is relative or empty.
    """
    path = text
    for scheme in SCHEMES:
        if path.startswith(f"{scheme}:"):
            path = path[len(scheme) + 1 :]
            if path.startswith("//"):
                path = "/" + path.lstrip("/")
            break
    if not path.startswith("/"):
        raise ValueError(f"{text!r} is not an absolute 3FS path (write /a/b or hf3fs:/a/b)")
    normalized = posixpath.normpath(path)
    # normpath keeps a leading '//' (POSIX allows it to be special); 3FS does not.
    return "/" + normalized.lstrip("/")


def to_url(path: str) -> str:
    """``hf3fs:///a/b`` for the absolute 3FS path ``/a/b``."""
    return f"{PROTOCOL}://{strip_scheme(path)}"
