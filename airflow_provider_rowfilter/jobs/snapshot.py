"""Table synchronization of a subscription's tables (PostgreSQL's tablesync worker): ``rowfilter snapshot``.

The module keeps the command's name (``python -m airflow_provider_rowfilter.jobs.snapshot``, what
SnapshotCopyOperator submits); "snapshot" inside it means only the publisher snapshot the copy reads, and
"copy" the COPY that moves the rows (tablesync.c copy_table).

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
after every check, so that a check that fails changes nothing. See docs/initial-sync.md.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack, closing, nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import psycopg

from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.errors import RowFilterError, SpecError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.jobs.arguments import parse, parser, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import fail, run_job
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
from airflow_provider_rowfilter.publisher.definitions import Definitions, load_definitions
from airflow_provider_rowfilter.publisher.failover import confirmed_timeline
from airflow_provider_rowfilter.subscriber import replication_origin
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
from airflow_provider_rowfilter.subscriber.state import APPLY_LOCK, RelState, StateError, StateStore, job_lock, migrate

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


def resync_again(tables: Sequence[TableName | str]) -> str:
    """The command that runs a failed ``resync --copy`` of ``tables`` again."""
    names = (t.as_sql() if isinstance(t, TableName) else t for t in tables)
    return f"run `rowfilter resync {' '.join(f'--table {t}' for t in names)} --copy` again"


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
    when a table first needs it, before that table changes (:class:`_SparkOnDemand`)."""
    options = options or CopyOptions()
    result = TableSyncResult(spec.subscription, resync=resync)
    with connect(spec.subscriber, "subscriber", spec) as sub:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        store.require_subscription()
        chosen = _chosen(store, tables)
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
        with _SparkOnDemand(spec, spark) as session:
            job = _CopyJob(spec, definitions, store, session, options, resync=resync)
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
        for rel in _chosen(store, tables):
            with _table_lock(sub, spec.subscription, rel.table):
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


def _chosen(store: StateStore, tables: Sequence[TableName] | None) -> list[RelState]:
    rels = store.tables()
    if tables is None:
        return rels
    known = {r.table: r for r in rels}
    unknown = [t for t in tables if t not in known]
    if unknown:
        raise StateError(f"table {unknown[0]} is not part of subscription {store.subscription!r}",
                         table=str(unknown[0]),
                         hint=f"its tables are {', '.join(str(t) for t in known) or 'none yet'}; a table newly "
                         "added to a publication joins after `rowfilter refresh`")
    return [known[t] for t in dict.fromkeys(tables)]


class _SparkOnDemand:
    """The job's Spark session, started the first time a table needs Spark: to run several readers, or
    to size them by Spark's parallelism. A table read by one reader copies without Spark, as tablesync
    does; a job of such tables never loads pyspark (its Connect client alone takes 0.7 s to import).

    Spark that cannot start, or cannot say its parallelism, stops the job before the table that asked
    for it changes (the tables copied before keep their copies, and the run again skips them): the
    error is kept as :attr:`failure`, which :meth:`_CopyJob.copy` lets through instead of recording it
    on the table (a Connect server that does not answer exits with the status Airflow retries).
    """

    def __init__(self, spec: SubscriptionSpec, given: SparkSession | None) -> None:
        self.spec = spec
        self.given = given
        self.session: SparkSession | None = None
        self.parallelism: int | None = None
        self.failure: Exception | None = None
        self.stack = ExitStack()

    def __enter__(self) -> _SparkOnDemand:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def __call__(self) -> SparkSession:
        if self.session is None:
            from airflow_provider_rowfilter.spark.session import job_session

            try:
                session = self.stack.enter_context(job_session(self.spec, "snapshot", self.given))
                _refuse_speculation(session)
            except Exception as e:
                self.failure = e
                raise
            self.session = session
        return self.session

    def default_parallelism(self) -> int:
        """Spark's default parallelism (one small action), asked once."""
        if self.parallelism is None:
            from airflow_provider_rowfilter.spark.copy_frames import default_parallelism

            session = self()
            try:
                self.parallelism = default_parallelism(session)
            except Exception as e:
                self.failure = e
                raise
        return self.parallelism


class _CopyJob:
    """The per-table copy, sharing the definitions, the state store and the Spark session (on demand)."""

    def __init__(self, spec: SubscriptionSpec, definitions: Definitions, store: StateStore,
                 spark: _SparkOnDemand, options: CopyOptions, *, resync: bool = False) -> None:
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
            with _table_lock(sub, self.spec.subscription, table):
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
            self.spark()  # started before the table changes (see _SparkOnDemand)
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
            # the catch-up replays from (apply/drain.py, _prune); a table in i or d keeps the log whole.
            with _applies_paused(sub, self.spec.subscription) if self.resync else nullcontext():
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
                    staged = run_partitions(self.spark(), reads, partial(
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


def _refuse_speculation(spark: SparkSession) -> None:
    # A speculative copy of a partition would commit the same rows twice.
    from airflow_provider_rowfilter.spark.copy_frames import speculation

    if speculation(spark):
        raise SpecError("spark.speculation=true would copy some partitions twice",
                        hint="set spark.speculation=false for the snapshot job (spark_conf in the spec)")


def _table_lock(conn: psycopg.Connection, subscription: str, table: TableName) -> AbstractContextManager[None]:
    """One copy or resync of a table at a time (a session advisory lock in the subscriber)."""
    return job_lock(conn, subscription, str(table), lambda: TableSyncError(
        f"table {table} is being copied or resynced by another job", table=str(table),
        hint="wait for that job to end, then run this one again"))


def _applies_paused(conn: psycopg.Connection, subscription: str) -> AbstractContextManager[None]:
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


# --- entry point -----------------------------------------------------------------------------------
def snapshot_parser():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--table", action="append", default=[], metavar="SCHEMA.TABLE",
                   help="copy this table (repeatable); default every table waiting for its copy")
    p.add_argument("--resync", action="store_true",
                   help="empty the named tables and copy them again (the backfill path)")
    p.add_argument("--max-partitions", type=int, help="most parallel readers per table (default: one, unless "
                   "the planner says several pay, then up to twice Spark's default parallelism; one reader "
                   "copies straight into the table)")
    p.add_argument("--fetch-size", type=int, default=DEFAULT_BLOCK_ROWS,
                   help="rows handed from the publisher's COPY to the subscriber's per write")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the result as JSON; non-zero on failure
    (exit status: jobs/exit_status.py)."""
    setup_logging()

    def body() -> int:
        args, spec = parse(snapshot_parser(), argv)
        tables = [TableName.from_sql(t, "--table") for t in args.table] or None
        options = CopyOptions(max_partitions=args.max_partitions, fetch_size=args.fetch_size)
        if args.resync:
            result = resync(spec, tables or [], copy=True, options=options)
        else:
            result = sync_tables(spec, tables, options=options)
        print(json.dumps(result.summary()))
        return 0 if result.ok else fail(result.error())

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
