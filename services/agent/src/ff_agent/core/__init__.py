"""Pure logic of the agent (no grpc, no generated code, no processes)."""
