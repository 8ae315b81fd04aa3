"""The subscriber session's ``session_replication_role``, as PostgreSQL's logical replication workers set it.

The apply worker and the table-sync worker both run as ``replica`` (``SetConfigOption`` at the start
of ApplyWorkerMain in src/backend/replication/logical/worker.c, which serves both before
PostgreSQL 17; SetupApplyOrSyncWorker from 17): ordinary triggers and foreign keys do not fire for
the rows they write. The apply's transaction (apply/batch_transaction.py) and table synchronization's (jobs/snapshot.py)
do the same through :func:`replica_role`.
"""

from __future__ import annotations

import logging

import psycopg

from airflow_provider_rowfilter.core.relation import TableName

log = logging.getLogger(__name__)


def replica_role(sub: psycopg.Connection, job: str, table: TableName | None = None) -> None:
    """``SET LOCAL session_replication_role = replica`` in ``sub``'s open transaction, when the role may.

    Setting it takes a superuser or, from PostgreSQL 15, ``GRANT SET ON PARAMETER`` (guc.c,
    set_config_with_handle: "permission denied to set parameter"). Without it the ``job`` (``apply``,
    ``copy``) runs all the same; the one-line warning (with the fix) is given only when it changes
    something: when the subscriber has a trigger that fires in one role and not the other
    (``tgenabled`` ``O``, which includes the foreign keys' internal triggers, or ``R``; ``A`` fires in
    both, ``D`` in neither: commands/trigger.c, TriggerEnabled). For a copy of ``table``, only that
    table's triggers (and its partitions') count: one line per table copied.
    """
    sub.execute("SAVEPOINT rowfilter_role")
    try:
        sub.execute("SET LOCAL session_replication_role = replica")
        sub.execute("RELEASE SAVEPOINT rowfilter_role")
        return
    except psycopg.errors.InsufficientPrivilege:
        sub.execute("ROLLBACK TO SAVEPOINT rowfilter_role")
    # pg_partition_tree lists a partitioned table's tree, and nothing for a plain table.
    on = "" if table is None else (" AND (tgrelid = %(t)s::regclass"
                                   " OR tgrelid IN (SELECT relid FROM pg_partition_tree(%(t)s::regclass)))")
    role, version, fires = sub.execute(
        "SELECT current_user, current_setting('server_version_num')::int, "
        f"EXISTS (SELECT 1 FROM pg_trigger WHERE tgenabled IN ('O', 'R'){on})",
        {} if table is None else {"t": table.as_sql()}).fetchone()
    fix = (f"GRANT SET ON PARAMETER session_replication_role TO {role}" if version >= 150000
           else f"ALTER ROLE {role} SUPERUSER")
    if not fires:
        log.info("session_replication_role stays origin (role %s may not set it); no trigger or foreign key of "
                 "the subscriber fires differently", role)
        return
    log.warning("session_replication_role stays origin: the subscriber's triggers and foreign keys fire during "
                "this %s%s, unlike PostgreSQL's %s worker; fix: %s", job, "" if table is None else f" of {table}",
                "apply" if job == "apply" else "table-sync", fix)
