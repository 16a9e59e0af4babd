"""Meta's calls done once (``ff_rpc.once``): sent again with the same key, each answers its first result.

The namespace changes that are not idempotent. Meta records their results under the caller's key; clients give each
call one key for all its attempts, and retry them after a lost connection as they retry idempotent calls.
"""

from __future__ import annotations

_SERVICE = "/fireflyer.meta.v1.MetaService/"

ONCE_METHODS: frozenset[str] = frozenset(
    _SERVICE + name for name in ("Mkdirs", "Symlink", "Mknod", "HardLink", "Remove", "Rename", "RestoreTrashEntry")
)
