"""Airflow hooks of airflow-provider-rowfilter."""
