"""A folder's listing as the mount hands it to the kernel (readdir and readdirplus, ``serve._Fuse.readdir_fuse_3``).

One listing per open folder, taken from meta at its first page and served page by page; an entry's attributes go
to the kernel as whole (readdirplus) only while the mount's state is as it was when the listing was taken
(``ListingMark``, ``Hf3fsOperations.still_whole``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hf3fs.entries import Stat


@dataclasses.dataclass(frozen=True)
class ListingMark:
    """This mount's state when a folder was listed (``Hf3fsOperations.still_whole`` compares it)."""

    releases: int  # writable handles released so far
    generation: int  # the attribute cache's generation
    taken_at: float  # time.monotonic() (when meta had answered, for a listing)

    def still_holds(self, now: ListingMark, ttl_s: float) -> bool:
        """Whether nothing changed through the mount since this mark (``now``) and it is at most ``ttl_s`` old."""
        fresh = now.taken_at - self.taken_at <= ttl_s
        return fresh and (now.releases, now.generation) == (self.releases, self.generation)


def list_folder(fs: Any, where: str, attrs_of: Callable[[Stat], dict[str, Any]]) -> list[Any]:
    """``.``, ``..`` and the folder's entries as ``(name, attributes, 0)``, from one meta listing.

    ``attrs_of`` gives an entry's attributes from its Stat. A folder that may be read but not searched lists its
    names alone (meta gives no attributes without search permission; ``ls -l`` shows them as unknown).
    """
    entries: list[Any] = [".", ".."]
    try:
        listed = fs.scandir(where)
    except PermissionError:
        entries.extend(fs.listdir(where))
        return entries
    entries.extend((e.name, attrs_of(e.stat), 0) for e in listed)
    return entries
