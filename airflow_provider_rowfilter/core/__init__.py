"""Pure-Python core: publication model, row-filter validation and translation. Imports neither Airflow nor Spark."""
