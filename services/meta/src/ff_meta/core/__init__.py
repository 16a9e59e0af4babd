"""Meta's rules, pure: no SQL, no grpc, no generated code."""
