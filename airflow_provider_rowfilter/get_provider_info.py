"""Provider metadata that Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_provider_rowfilter import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-rowfilter",
        "name": "Row Filter (PostgreSQL logical replication on Spark)",
        "description": "PostgreSQL publication row filters, column lists and per-table sync state "
        "for replication pipelines scheduled by Airflow and executed on Spark.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "PostgreSQL logical replication (row filters)",
                "external-doc-url": "https://www.postgresql.org/docs/current/logical-replication.html",
                "tags": ["software"],
            }
        ],
    }
