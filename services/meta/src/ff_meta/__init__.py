"""meta: the 3FS metadata service (inodes and directory entries over a transactional SQL store)."""
