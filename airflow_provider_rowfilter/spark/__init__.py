"""PySpark jobs and their session. Imports core and pyspark, never Airflow."""
