"""Airflow operators of airflow-provider-rowfilter: each submits one of the package's jobs."""
