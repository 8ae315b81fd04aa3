"""The subscriber session's ``session_replication_role``, as PostgreSQL's logical replication workers set it.

The apply worker and the table-sync worker both run as ``replica`` (``SetConfigOption`` at the start
of ApplyWorkerMain in src/backend/replication/logical/worker.c, which serves both before
PostgreSQL 17; SetupApplyOrSyncWorker from 17): ordinary triggers and foreign keys do not fire for
the rows they write. The apply's transaction (flows/apply/batch_transaction.py) and table synchronization's
(flows/table_sync/table_copy.py) do the same through :func:`replica_role`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg

from airflow_provider_rowfilter.core.relation import TableName

log = logging.getLogger(__name__)


#: What this process already warned about: (role, job, tables), once each (a draining run applies many batches).
_warned: set[tuple[str, str, tuple[str, ...]]] = set()


def replica_role(sub: psycopg.Connection, job: str, table: TableName | None = None, *,
                 tables: Sequence[TableName] | None = None) -> None:
    """``SET LOCAL session_replication_role = replica`` in ``sub``'s open transaction, when the role may.

    Setting it takes a superuser or, from PostgreSQL 15, ``GRANT SET ON PARAMETER`` (guc.c,
    set_config_with_handle: "permission denied to set parameter"). Without it the ``job`` (``apply``,
    ``copy``) runs all the same; the one-line warning (with the fix) is given only when it changes
    something: when a table the transaction writes has a trigger that fires in one role and not the
    other (``tgenabled`` ``O``, which includes the foreign keys' internal triggers, or ``R``; ``A`` fires in
    both, ``D`` in neither: commands/trigger.c, TriggerEnabled), on itself or its partitions: ``table``
    for a copy, ``tables`` for an apply's batch (None: every table of the database). A foreign key's
    checks are triggers of both its tables (ri_triggers.c), so its referencing and referenced tables are
    both found. Once per process for the same role, job and tables; otherwise a DEBUG line.
    """
    sub.execute("SAVEPOINT rowfilter_role")
    try:
        sub.execute("SET LOCAL session_replication_role = replica")
        sub.execute("RELEASE SAVEPOINT rowfilter_role")
        return
    except psycopg.errors.InsufficientPrivilege:
        sub.execute("ROLLBACK TO SAVEPOINT rowfilter_role")
    written = [table] if table is not None else list(tables) if tables is not None else None
    if written == []:
        return  # a batch that writes no table: nothing can fire
    # pg_partition_tree lists a partitioned table's tree, and nothing for a plain table.
    on = "" if written is None else (
        " AND tgrelid IN (SELECT t::regclass FROM unnest(%(t)s::text[]) AS t"
        " UNION ALL SELECT relid FROM unnest(%(t)s::text[]) AS t, pg_partition_tree(t::regclass))")
    role, version, fires = sub.execute(
        "SELECT current_user, current_setting('server_version_num')::int, "
        f"array(SELECT DISTINCT tgrelid::regclass::text FROM pg_trigger WHERE tgenabled IN ('O', 'R'){on} ORDER BY 1)",
        {} if written is None else {"t": [t.as_sql() for t in written]}).fetchone()
    fix = (f"GRANT SET ON PARAMETER session_replication_role TO {role}" if version >= 150000
           else f"ALTER ROLE {role} SUPERUSER")
    if not fires:
        log.debug("session_replication_role stays origin (role %s may not set it); no trigger or foreign key of the "
                  "tables written fires differently", role)
        return
    key = (role, job, tuple(fires))
    if key in _warned:
        log.debug("session_replication_role stays origin for this %s too (triggers of %s)", job, ", ".join(fires))
        return
    _warned.add(key)
    log.warning("session_replication_role stays origin: the triggers and foreign keys of %s fire during this %s, "
                "unlike PostgreSQL's %s worker; fix: %s", ", ".join(fires), job,
                "apply" if job == "apply" else "table-sync", fix)
