"""Meta's calls done once (``ff_rpc.once``): sent again with the same key, each answers its first result.

The namespace changes that are not idempotent. Meta records their results under the caller's key; clients give each
call one key for all its attempts, and retry them after a lost connection as they retry idempotent calls.

A meta instance that records them says so in its mgmtd registration (tag ``ONCE_TAG``). A client retries these calls
only while every meta instance it may call does: an older instance would run a retry as a new call (applied twice).
"""

from __future__ import annotations

_SERVICE = "/fireflyer.meta.v1.MetaService/"

# The tag (and its value) of a meta instance's mgmtd registration that says it does ``ONCE_METHODS`` once per key.
ONCE_TAG, ONCE_TAG_VALUE = "calls_once", "1"

ONCE_METHODS: frozenset[str] = frozenset(
    _SERVICE + name for name in ("Mkdirs", "Symlink", "Mknod", "HardLink", "Remove", "Rename", "RestoreTrashEntry")
)
