"""Storage service: 3FS chunk store with CRAQ chain replication."""
