"""Pure logic of the collector: validation, downsampling math, query evaluation (no grpc, no SQL)."""
