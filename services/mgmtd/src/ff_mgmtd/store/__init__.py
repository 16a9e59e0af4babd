"""mgmtd's persistent state in SQL (SQLite by default, PostgreSQL for several instances)."""
