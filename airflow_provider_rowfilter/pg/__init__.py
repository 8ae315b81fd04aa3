"""PostgreSQL access over psycopg (publisher catalog, local cluster). Imports neither Airflow nor Spark."""
