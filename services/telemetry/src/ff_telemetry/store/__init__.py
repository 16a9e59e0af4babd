"""The collector's samples in SQL (SQLite by default, PostgreSQL at scale): ingest, queries, downsampling."""
