"""Dropping the replication origins a test's applies made, which belong to the cluster, not to its databases."""

from __future__ import annotations

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres


def drop_origins(pg: LocalPostgres) -> None:
    """Drop the replication origins our applies made (subscriber/replication_origin.py): they belong to the cluster,
    not to the test's databases, and each holds one of its max_active_replication_origins states until dropped, as
    a native subscription's does until DROP SUBSCRIPTION."""
    import psycopg

    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        for (name,) in conn.execute("SELECT roname FROM pg_replication_origin WHERE roname LIKE 'rowfilter\\_%'"
                                    ).fetchall():
            try:
                conn.execute("SELECT pg_replication_origin_drop(%s)", (name,))
            except psycopg.errors.ObjectInUse:
                pass  # a job of the test still runs (its process is being stopped): the next test drops it
