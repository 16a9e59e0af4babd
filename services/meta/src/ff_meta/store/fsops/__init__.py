"""The file-system operations as transaction bodies over the INOD/DENT tables.

Every public function in these modules takes a ``Tx`` (one serializable transaction, run by ``MetaStore`` and
re-run on conflict) and does only reads and writes through it: no RPCs, no clocks of its own (the caller passes
``now_ns``), so a re-run is harmless. The rules come from ``core`` (``tx.paths``, ``tx.quotas``, ``core.perms``,
``core.layout``); storage work (exact lengths, chunk removal) is done by the operators (``ops/``) around these
transactions. ``reads``: Stat, List, RealPath, StatFs; ``namespace``: inode ids and the entries' mutations (Mkdirs,
Symlink, Mknod, Link, Remove, Rename, SetAttr); ``files``: Create, Open, truncate; ``sessions``: write sessions and
the lengths they bring (Close, Sync, Renew, Reserve, collection); ``quotas``: directory quotas.
"""
