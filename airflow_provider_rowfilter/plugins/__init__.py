"""Airflow plugins of the provider (the "Replication" page of the UI)."""
