"""The scheduler's state in SQL (SQLite by default, PostgreSQL at scale)."""
