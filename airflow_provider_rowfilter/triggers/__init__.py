"""Airflow triggers of airflow-provider-rowfilter (run by the triggerer, asyncio)."""
