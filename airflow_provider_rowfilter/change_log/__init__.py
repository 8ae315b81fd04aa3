"""The durable change log between the capture and the apply: Parquet segments and the log's position (pyarrow; no PostgreSQL)."""
