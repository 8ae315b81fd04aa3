"""One table's copy (tablesync.c copy_table), as ``rowfilter snapshot`` and ``resync --copy`` run it (sync.py).

:class:`CopyJob` copies one table in ``i`` or ``d``: every check first, then the publisher snapshot and ONE
subscriber transaction moving the table to ``d``, then the rows, by one reader straight into the table in the
transaction that records ``f``, or by several readers as Spark tasks into a staging table moved in one
transaction. flows/spark_on_demand.py ``SparkOnDemand`` starts Spark only for a table that needs it. A failure is
recorded on its table and the other tables go on.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack, closing, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import psycopg

from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.errors import RowFilterError, SpecError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.flows.spark_on_demand import SparkOnDemand
from airflow_provider_rowfilter.publisher.copy_source import (
    DEFAULT_BLOCK_ROWS,
    PartitionOptions,
    copy_out_statements,
    copy_source,
    estimated_rows,
    exported_snapshot,
    plan_partitions,
    read_copy,
)
from airflow_provider_rowfilter.publisher.definitions import Definitions
from airflow_provider_rowfilter.publisher.failover import confirmed_timeline
from airflow_provider_rowfilter.subscriber import conflicts, replication_origin
from airflow_provider_rowfilter.subscriber.copy_progress import DEFAULT_INTERVAL, copy_done, copy_failed, copy_progress
from airflow_provider_rowfilter.subscriber.copy_target import (
    CopyFence,
    CopyTarget,
    check_target,
    copy_direct,
    copy_lock_key,
    create_staging,
    drop_staging,
    executor_conninfo,
    fence_copies,
    move_staged,
    truncate,
)
from airflow_provider_rowfilter.subscriber.replica_role import replica_role
from airflow_provider_rowfilter.subscriber.state import APPLY_LOCK, RelState, StateError, StateStore, job_lock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


COPYABLE = (SyncState.INIT, SyncState.DATA_COPY)


class TableSyncError(RowFilterError):
    """Table synchronization of one or more tables failed (each keeps its state and its error)."""


@dataclass(frozen=True)
class CopyOptions:
    """Tuning of the copy. ``max_partitions`` None: one reader, unless the split pays (publisher/copy_source.py
    ``split_pays``), then at most twice Spark's default parallelism;
    ``fetch_size`` is the rows handed from the publisher's COPY to the subscriber's per write;
    ``progress_interval`` the seconds between two progress lines (subscriber/copy_progress.py)."""

    max_partitions: int | None = None
    min_pages: int = PartitionOptions(None).min_pages
    fetch_size: int = DEFAULT_BLOCK_ROWS
    progress_interval: float = DEFAULT_INTERVAL


@dataclass
class TableCopy:
    """What the job did with one table."""

    table: str
    state: str
    rows_copied: int | None = None
    lsn: str | None = None
    partitions: int | None = None
    seconds: float | None = None
    error: str | None = None
    note: str | None = None


def resync_again(tables: Sequence[TableName | str]) -> str:
    """The command that runs a failed ``resync --copy`` of ``tables`` again."""
    names = (t.as_sql() if isinstance(t, TableName) else t for t in tables)
    return f"run `rowfilter resync {' '.join(f'--table {t}' for t in names)} --copy` again"


class CopyJob:
    """The per-table copy, sharing the definitions, the state store and the Spark session (on demand)."""

    def __init__(self, spec: SubscriptionSpec, definitions: Definitions, store: StateStore,
                 spark: SparkOnDemand, options: CopyOptions, *, resync: bool = False) -> None:
        self.spec = spec
        self.resync = resync  # copy again whatever the state, emptying the table when the copy starts
        self.definitions = definitions
        self.store = store
        self.spark = spark
        self.options = options
        app = f"rowfilter:{spec.subscription}:snapshot"
        self.source_conninfo = executor_conninfo(_required(spec.publisher, "publisher", spec), "publisher", app)
        self.target_conninfo = executor_conninfo(_required(spec.subscriber, "subscriber", spec), "subscriber", app)
        # Spark's parallelism is asked only for a table whose split pays, with no bound given.
        self.partitions = PartitionOptions(options.max_partitions, options.min_pages,
                                           lambda: 2 * spark.default_parallelism())

    def copy(self, rel: RelState) -> TableCopy:
        table = rel.table
        sub = self.store.conn
        started: list[CopyTarget] = []  # set once the copy's first transaction has committed
        try:
            with table_lock(sub, self.spec.subscription, table):
                return self._copy_locked(table, started)
        except Exception as e:  # every failure is recorded on the table; the other tables go on
            if e is self.spark.failure:
                raise  # the job's Spark (started before the copy starts), not the table's: the job stops
            message = describe(e)
            log.error("%s: table synchronization failed: %s", table, message)
            copy_failed(table)
            log.debug("%s: the failure in full", table, exc_info=True)
            if sub.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                sub.rollback()
            if started:  # what the attempt staged goes; the table's own rows were never touched
                _drop_staging_quietly(sub, started[0])
            if started or not self.resync:  # a resync that did not start leaves the table as it was
                self.store.record_error(table, message)
                conflicts.count_error(sub, self.store.subscription, "sync_table_error_count")
            (now,) = self.store.tables([table])
            return TableCopy(str(table), now.state.value, error=message)

    def _copy_locked(self, table: TableName, started: list[CopyTarget]) -> TableCopy:
        sub = self.store.conn
        (rel,) = self.store.tables([table])  # again, under the lock
        if rel.reconciling and not self.resync:
            return TableCopy(str(table), rel.state.value, note="held by a reconcile: run `rowfilter reconcile`")
        if rel.state not in COPYABLE and not self.resync:
            return TableCopy(str(table), rel.state.value, rel.rows_copied, rel.lsn,
                             note=f"copied meanwhile by another job (state {rel.state.value})")
        refused = self.definitions.filters.refused.get(table)
        if refused is not None:  # on_invalid_table: skip: not copied, and no failure (refresh recorded why)
            log.warning("%s: not copied, its definition is refused (on_invalid_table: skip): %s", table, refused)
            return TableCopy(str(table), rel.state.value, note=f"skipped, refused (on_invalid_table: skip): {refused}")
        filters = self.definitions.filters.tables.get(table)
        if filters is None:
            raise StateError(f"table {table} is in the subscription but none of its publications publishes it now",
                             table=str(table), hint="run `rowfilter refresh` to reconcile the subscription's tables")
        source = copy_source(filters, self.definitions.catalog.relation(table))
        # Every check before any row moves: the table keeps its state when one fails.
        target = check_target(sub, self.spec.subscription, table, source.columns,
                              rerun=resync_again([table]) if self.resync else "run the snapshot again")
        began = time.monotonic()
        with connect(self.spec.publisher, "publisher", self.spec) as pub:
            plan = plan_partitions(pub, source, self.partitions)
            estimate = estimated_rows(pub, source)
        reads = copy_out_statements(source, plan)
        # One reader needs no staging table: it COPYs straight into the table in the transaction that
        # records f, as tablesync does, and writes each row once (subscriber/copy_target.py copy_direct).
        direct = len(reads) == 1
        if not direct:
            self.spark.get()  # started before the table changes (see flows/spark_on_demand.py)
        with ExitStack() as held:
            # The copy starts with the snapshot it reads, then ONE subscriber transaction: a new staging
            # table (an interrupted attempt's is dropped with what it staged: the copy is redone from
            # nothing, as tablesync redoes it; a direct copy only drops it), the table emptied if a
            # resync, and the move to d. A
            # failure of either leaves the table as it was (the snapshot's slot goes with it). The
            # snapshot comes first, while no subscriber transaction is open: creating a logical slot
            # waits for every transaction of its cluster that has an xid
            # (SnapBuildWaitSnapshot in src/backend/replication/logical/snapbuild.c), so with the
            # publisher and the subscriber in one cluster it would wait for our own transaction.
            # A table past its copy (a resync) holds the apply's lock from the snapshot to the move
            # to d, so that no batch moves its position past the snapshot and prunes the change log
            # the catch-up replays from (flows/apply/drain.py, _prune); a table in i or d keeps the log whole.
            with resync_apply_lock(sub, self.spec.subscription) if self.resync else nullcontext():
                snap = held.enter_context(exported_snapshot(
                    connect(self.spec.publisher, "publisher", self.spec, replication="database")))
                with connect(self.spec.publisher, "publisher", self.spec) as pub:  # failover: before the copy
                    timeline = confirmed_timeline(pub, snap.lsn)
                with sub.transaction():
                    fence_copies(sub, copy_lock_key(self.spec.subscription, table))
                    if direct:
                        drop_staging(sub, target)
                    else:
                        create_staging(sub, target)
                    if self.resync:  # resync empties the table (docs/initial-sync.md); a first copy keeps its rows
                        truncate(sub, target)
                    if self.resync:
                        self.store.set_state(table, SyncState.INIT, resync=True)
                    self.store.set_state(table, SyncState.DATA_COPY)
            started.append(target)
            log.info("%s: copying rows where %s (publications %s), columns %s, in %s%s",
                     table, source.filter_sql or "TRUE (no filter)", ", ".join(filters.publications),
                     ", ".join(source.columns), plan.describe(), "" if source.only else ", all partitions")
            with copy_progress(lambda: connect(self.spec.subscriber, "subscriber", self.spec), table,
                               target.table if direct else target.staging, estimate, self.options.progress_interval,
                               writer_pid=sub.info.backend_pid if direct else None):
                if direct:  # the rows and the state f, together, tagged as the copy's (replication_origin.py)
                    with replication_origin.copy_origin(sub, self.spec.subscription, target.table), \
                            sub.transaction():
                        replica_role(sub, "copy", table)
                        with closing(read_copy(self.source_conninfo, reads[0], snap,
                                               block_rows=self.options.fetch_size)) as blocks:
                            rows = copy_direct(sub, blocks, target)
                        self.store.set_state(table, SyncState.FINISHED_COPY, lsn=snap.lsn, rows_copied=rows,
                                             timeline=timeline)
                else:
                    from airflow_provider_rowfilter.spark.copy_frames import copy_partition, run_partitions

                    # The writers' fence: this attempt's updated_at, as set_state(d) wrote it.
                    fence = CopyFence(self.spec.subscription, table.schema, table.name, self.store.copy_token(table))
                    staged = run_partitions(self.spark.get(), reads, partial(
                        copy_partition, self.source_conninfo, snap, self.target_conninfo, target.copy_sql(),
                        fence=fence, block_rows=self.options.fetch_size))
        if not direct:  # the rows and the state f, together, tagged as the copy's (replication_origin.py)
            with replication_origin.copy_origin(sub, self.spec.subscription, target.table), sub.transaction():
                replica_role(sub, "copy", table)
                rows = move_staged(sub, target)
                if rows != staged:  # a task committed twice (a lost executor) into a table without a key
                    raise TableSyncError(
                        f"the partitions staged {staged} rows but {rows} arrived", table=str(table),
                        hint="a Spark task was retried after its COPY committed; run the snapshot again "
                        "(spark.task.maxFailures=1 for the snapshot job avoids it)")
                self.store.set_state(table, SyncState.FINISHED_COPY, lsn=snap.lsn, rows_copied=rows, timeline=timeline)
        seconds = time.monotonic() - began
        log.info("%s: %d rows copied in %.1f s (%.0f rows/s), consistent with %s: changes committed from there "
                 "on are the catch-up's; state f", table, rows, seconds, rows / seconds if seconds else 0, snap.lsn)
        copy_done(table, rows, seconds)
        return TableCopy(str(table), SyncState.FINISHED_COPY.value, rows, snap.lsn, plan.partitions, round(seconds, 3))


def _required(url: str | None, role: str, spec: SubscriptionSpec) -> str:
    if not url:
        raise SpecError(f"subscription {spec.subscription!r} has no {role} URL",
                        hint=f"set {role}: postgresql://user@host:port/db in the spec")
    return url


def _drop_staging_quietly(conn: psycopg.Connection, target: CopyTarget) -> None:
    try:
        with conn.transaction():
            drop_staging(conn, target)
    except psycopg.Error as e:  # the next attempt drops it anyway
        log.warning("%s: could not drop the staging table %s: %s", target.table, target.staging, describe(e))


def refuse_speculation(spark: SparkSession) -> None:
    """Refuse a session that copies speculatively: a speculative copy of a partition would commit the same rows twice."""
    from airflow_provider_rowfilter.spark.copy_frames import speculation

    if speculation(spark):
        raise SpecError("spark.speculation=true would copy some partitions twice",
                        hint="set spark.speculation=false for the snapshot job (spark_conf in the spec)")


def table_lock(conn: psycopg.Connection, subscription: str, table: TableName) -> AbstractContextManager[None]:
    """One copy or resync of a table at a time (a session advisory lock in the subscriber)."""
    return job_lock(conn, subscription, str(table), lambda: TableSyncError(
        f"table {table} is being copied or resynced by another job", table=str(table),
        hint="wait for that job to end, then run this one again"))


def resync_apply_lock(conn: psycopg.Connection, subscription: str) -> AbstractContextManager[None]:
    """The apply's job lock, held by a resync while it starts its copy; refused while a batch runs."""
    return job_lock(conn, subscription, APPLY_LOCK, lambda: TableSyncError(
        f"an apply of subscription {subscription!r} is running; the table was left as it was",
        hint="run the resync again when the batch has ended (or pause the incremental DAG)"))


_CAUSES = (
    re.compile(r"psycopg\.errors\.\w+: (.+)"),
    re.compile(r"psycopg\.\w*Error: (.+)"),
)


def describe(error: BaseException) -> str:
    """A one-paragraph cause: our errors whole, database errors by their message, Spark's by the root cause."""
    if isinstance(error, RowFilterError):
        return str(error)
    if isinstance(error, psycopg.Error) and error.diag.message_primary:
        return f"{error.diag.message_primary}" + (f" ({error.diag.context.strip()})" if error.diag.context else "")
    text = str(error)
    for pattern in _CAUSES:
        found = pattern.findall(text)
        if found:
            lines = [found[0].strip()]
            context = re.search(r"CONTEXT:\s+(.+)", text)
            if context:
                lines.append(f"({context.group(1).strip()})")
            return " ".join(lines)
    first = next((line for line in text.splitlines() if line.strip()), type(error).__name__)
    return f"{type(error).__name__}: {first.strip()[:500]}"
