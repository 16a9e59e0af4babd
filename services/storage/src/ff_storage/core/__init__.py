"""Pure decisions of the storage service (no grpc, no generated code, no I/O)."""
