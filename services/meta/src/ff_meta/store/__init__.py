"""Meta's storage: the SQL tables and transactions, and calls to storage services."""
