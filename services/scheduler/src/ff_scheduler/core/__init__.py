"""The scheduler's decisions as pure code: no grpc, no SQL, no clocks of its own."""
