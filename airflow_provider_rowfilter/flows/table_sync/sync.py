"""Table synchronization of a subscription's tables (PostgreSQL's tablesync worker): ``rowfilter snapshot``.

Its entry point keeps the command's name (jobs/snapshot.py, what SnapshotCopyOperator submits); "snapshot"
here means only the publisher snapshot the copy reads, and "copy" the COPY that moves the rows (tablesync.c
copy_table).

For each chosen table in state ``i`` (or ``d``, a copy that did not finish): ``d``, then the rows
that satisfy ANY of the subscription's publications' filters (``publish`` ignored), only the
published columns, read from one publisher snapshot (exported by a temporary slot, as tablesync's)
with ``COPY … TO STDOUT``. One reader (the default, as tablesync) streams them from the job's own
process straight into ``COPY table FROM STDIN``, in the transaction that sets ``f`` with the slot's
consistent point (changes committed from there on are the catch-up's) and the rows copied; no Spark
session is started for it. Several readers (``max_partitions``, or where the planner says they pay:
publisher/copy_source.py ``split_pays``) run as Spark tasks into the attempt's staging table, and ONE
transaction then moves the rows into the table and sets ``f``. Either way the table keeps the rows it
had, as PostgreSQL's copy does, and a duplicate key fails the copy. A table whose copy fails keeps its
state, its rows and the error; a later run copies again from nothing, as tablesync redoes an
interrupted copy.

``resync`` empties the named tables and sends them back to ``i`` (the backfill path); with
``copy`` it copies them at once instead, emptying each in the transaction that starts its copy,
after every check, so that a check that fails changes nothing. See docs/initial-sync.md. One table's copy
is flows/table_sync/table_copy.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import psycopg

from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.flows.spark_on_demand import SparkOnDemand
from airflow_provider_rowfilter.flows.table_sync.table_copy import (
    COPYABLE,
    CopyJob,
    CopyOptions,
    TableCopy,
    TableSyncError,
    describe,
    refuse_speculation,
    resync_again,
    table_lock,
)
from airflow_provider_rowfilter.publisher.definitions import load_definitions
from airflow_provider_rowfilter.subscriber.copy_target import (
    check_target,
    copy_lock_key,
    fence_copies,
    truncate,
)
from airflow_provider_rowfilter.subscriber.state import StateStore, migrate

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

@dataclass
class TableSyncResult:
    subscription: str
    tables: list[TableCopy] = field(default_factory=list)
    resync: bool = False  # `rowfilter resync --copy`: its own command is the one to run again

    @property
    def failed(self) -> list[TableCopy]:
        return [t for t in self.tables if t.error]

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> dict:
        return {"subscription": self.subscription, "ok": self.ok,
                "rows_copied": sum(t.rows_copied or 0 for t in self.tables),
                "tables": [asdict(t) for t in self.tables]}

    def error(self) -> TableSyncError:
        lines = [f"{t.table}: {t.error}" for t in self.failed]
        return TableSyncError(
            f"table synchronization of {len(lines)} table(s) of subscription {self.subscription!r} failed:\n  "
            + "\n  ".join(lines),
            hint=(f"fix the cause and {resync_again([t.table for t in self.failed])}: a table whose copy did not "
                  "start is as it was" if self.resync else "fix the cause and run the snapshot again: a table left "
                  "in state d is copied again from nothing, one still in i is copied; their own rows stay"))

# --- the job ---------------------------------------------------------------------------------------
def sync_tables(spec: SubscriptionSpec, tables: Sequence[TableName] | None = None, *,
                 spark: SparkSession | None = None, options: CopyOptions | None = None) -> TableSyncResult:
    """Copy every chosen table in ``i`` or ``d``; a table in a later state is left alone and reported.

    :param tables: the tables to copy (each must be part of the subscription); default all.
    :param spark: the session to run in; default the active one, else one built from the spec
        (and stopped at the end).
    """
    return _copy_tables(spec, tables, resync=False, spark=spark, options=options)


def _copy_tables(spec: SubscriptionSpec, tables: Sequence[TableName] | None, *, resync: bool,
                 spark: SparkSession | None, options: CopyOptions | None) -> TableSyncResult:
    """Table synchronization, or with ``resync`` the copy again of ``tables`` whatever their state. Every check
    that concerns all tables (the definitions) runs before any table changes; the Spark session starts
    when a table first needs it, before that table changes (flows/spark_on_demand.py)."""
    options = options or CopyOptions()
    result = TableSyncResult(spec.subscription, resync=resync)
    with connect(spec.subscriber, "subscriber", spec) as sub:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        store.require_subscription()
        chosen = store.chosen_tables(tables)
        todo = chosen if resync else [r for r in chosen if r.state in COPYABLE and not r.reconciling]
        for rel in chosen:
            if rel.reconciling and not resync:
                result.tables.append(TableCopy(str(rel.table), rel.state.value, note="held by a reconcile that did not "
                                               "finish: run `rowfilter reconcile` for it (its rows are kept)"))
            elif rel not in todo:
                result.tables.append(TableCopy(str(rel.table), rel.state.value, rel.rows_copied, rel.lsn,
                                               note=f"already copied (state {rel.state.value}); "
                                               "use resync to copy it again"))
        if not todo:
            log.info("subscription %s: no table waits for table synchronization", spec.subscription)
            return result
        with connect(spec.publisher, "publisher", spec) as pub:
            definitions = load_definitions(spec, pub)
        with SparkOnDemand(spec, spark, "snapshot", check=refuse_speculation) as session:
            job = CopyJob(spec, definitions, store, session, options, resync=resync)
            for rel in todo:
                result.tables.append(job.copy(rel))
    return result


def resync(spec: SubscriptionSpec, tables: Sequence[TableName], *, copy: bool = False,
           spark: SparkSession | None = None, options: CopyOptions | None = None) -> TableSyncResult:
    """Empty each table in the subscriber and send it back to ``i`` (one transaction per table).

    With ``copy`` each table is copied right away instead, whatever its state: the definitions, the
    table's lock, its publication, the subscriber's table and, for several readers, the Spark session
    are checked first,
    and the table is emptied and moved to ``d`` in the transaction that creates the copy's snapshot
    on the publisher, so a failure before the copy starts leaves its rows and its state as they were
    (and records nothing). Without ``copy`` the next snapshot copies them. Changes to them are not
    applied until their new copy reaches ``f``.
    """
    if not tables:
        raise SpecError("resync needs the tables to copy again", hint="name them: --table public.t1")
    if copy:
        return _copy_tables(spec, tables, resync=True, spark=spark, options=options)
    with connect(spec.subscriber, "subscriber", spec) as sub:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        store.require_subscription()
        for rel in store.chosen_tables(tables):
            with table_lock(sub, spec.subscription, rel.table):
                target = check_target(sub, spec.subscription, rel.table, ())
                try:
                    with sub.transaction():
                        fence_copies(sub, copy_lock_key(spec.subscription, rel.table))
                        truncate(sub, target)
                        store.set_state(rel.table, SyncState.INIT, resync=True)
                except psycopg.Error as e:  # e.g. lock_timeout while another session holds the table
                    raise TableSyncError(f"cannot empty table {rel.table}: {describe(e)}", table=str(rel.table),
                                        hint="nothing was changed; run the resync again once the table is free"
                                        ) from e
            log.info("%s: emptied and sent back to state i (was %s)", rel.table, rel.state.value)
    return TableSyncResult(spec.subscription, [
        TableCopy(str(t), SyncState.INIT.value, note="emptied; the next snapshot copies it") for t in tables])
