"""Provider metadata that Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_provider_rowfilter import __version__

INTEGRATION = "PostgreSQL logical replication (row filters)"


def get_provider_info() -> dict:
    """Return what Airflow's ProvidersManager lists: modules by role, as official providers do.

    No connection type of our own: the operators take Airflow's ``postgres`` connections
    (apache-airflow-providers-postgres) and ``spark`` connections (apache-airflow-providers-apache-spark).
    """
    return {
        "package-name": "airflow-provider-rowfilter",
        "name": "Row Filter (PostgreSQL logical replication on Spark)",
        "description": "PostgreSQL publication row filters, column lists and per-table sync state "
        "for replication pipelines scheduled by Airflow and executed on Spark.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://www.postgresql.org/docs/current/logical-replication.html",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_provider_rowfilter.operators.apply_changes",
                    "airflow_provider_rowfilter.operators.apply_dag",
                    "airflow_provider_rowfilter.operators.metrics",
                    "airflow_provider_rowfilter.operators.refresh_publication",
                    "airflow_provider_rowfilter.operators.replication_link",
                    "airflow_provider_rowfilter.operators.rowfilter_job",
                    "airflow_provider_rowfilter.operators.slot_guard",
                    "airflow_provider_rowfilter.operators.snapshot_copy",
                    "airflow_provider_rowfilter.operators.subscription_guard",
                    "airflow_provider_rowfilter.operators.subscription_lag",
                    "airflow_provider_rowfilter.operators.subscription_ops",
                    "airflow_provider_rowfilter.operators.table_assets",
                    "airflow_provider_rowfilter.operators.verify_tables",
                    "airflow_provider_rowfilter.operators.reconcile_tables",
                    "airflow_provider_rowfilter.operators.task_errors",
                ],
            }
        ],
        "extra-links": ["airflow_provider_rowfilter.operators.replication_link.ReplicationPageLink"],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_provider_rowfilter.sensors.subscription_lsn",
                                   "airflow_provider_rowfilter.sensors.subscription_rel"],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_provider_rowfilter.triggers.subscription_lsn",
                                   "airflow_provider_rowfilter.triggers.subscription_rel"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_provider_rowfilter.hooks.job_output",
                    "airflow_provider_rowfilter.hooks.rowfilter",
                    "airflow_provider_rowfilter.hooks.spark_submit_job",
                    "airflow_provider_rowfilter.hooks.spec_resolver",
                    "airflow_provider_rowfilter.hooks.store_connection",
                    "airflow_provider_rowfilter.hooks.subscription_rel",
                ],
            }
        ],
    }
