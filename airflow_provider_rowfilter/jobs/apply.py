"""ApplyChanges: one micro-batch from the slot to the subscriber, with PostgreSQL's row-filter semantics, exactly once.

A run captures one bounded batch from the slot into the change log (publisher/capture.py), then applies
everything the log holds past each table's position: Spark judges and reduces the changes
(spark/apply_frames.py), the net effect is staged in the subscriber, and ONE subscriber transaction
writes every table (subscriber/apply_target.py), moves every table's position and state (``f`` → ``s`` →
``r``) and records the batch. Killed anywhere, a rerun starts from the positions that transaction
committed and reads the same log again: nothing is lost or applied twice (docs/apply.md).

Prints one JSON line: the batch summary (also kept in ``rowfilter.batch_history``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import psycopg

from airflow_provider_rowfilter.change_log.log import (
    ChangeLog,
    Segment,
    segment_counts,
    segment_filtering,
    segment_relations,
)
from airflow_provider_rowfilter.connection import PASSWORD_ENV, connect, primary_message
from airflow_provider_rowfilter.core import faults
from airflow_provider_rowfilter.core.apply_plan import (
    PASS_THROUGH,
    ApplyPlan,
    Epochs,
    RelationSpan,
    TargetPlan,
    check_relations,
    epochs_from_history,
)
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spark_settings import SHORT_BATCH_CHANGES
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.jobs.arguments import parse, parser, positive, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import run_job
from airflow_provider_rowfilter.jobs.refresh import slot_lost
from airflow_provider_rowfilter.publisher.capture import DEFAULT_MAX_CHANGES, capture
from airflow_provider_rowfilter.publisher.capture_objects import SlotMissingError
from airflow_provider_rowfilter.subscriber.apply_target import (
    ApplyTarget,
    ConflictError,
    StagedTable,
    TableCounts,
    clear_stage,
    new_token,
    read_target,
    rejected_column,
)
from airflow_provider_rowfilter.subscriber.copy_target import executor_conninfo
from airflow_provider_rowfilter.subscriber.state import (
    APPLIED,
    APPLY_LOCK,
    RelState,
    StateStore,
    SubscriptionRow,
    job_lock,
    migrate,
    relation_exists,
)

if TYPE_CHECKING:  # the job starts Spark only when a batch has changes to apply
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class ApplyError(RowFilterError):
    """The batch cannot be applied (nothing of it was)."""


class ApplyBusyError(ApplyError):
    """Another apply of the subscription holds its lock (not recorded as the subscription's error)."""

    transient = True


@dataclass
class ApplyResult:
    """What one run did (the task's XCom, the JSON line, and ``rowfilter.batch_history``)."""

    subscription: str
    start_lsn: str | None = None
    end_lsn: str | None = None
    segments: int = 0
    transactions: int = 0
    changes: int = 0
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    skipped_lsn: str | None = None
    lag_bytes: int | None = None
    lag_seconds: float | None = None
    duration_ms: int = 0
    batch_id: int | None = None
    capture: dict | None = None

    @property
    def changed_tables(self) -> list[str]:
        return sorted(t for t, c in self.tables.items()
                      if any(c.get(k) for k in ("insert", "update", "delete", "truncate")))

    def summary(self) -> dict:
        return {**asdict(self), "changed_tables": self.changed_tables}


def apply(spec: SubscriptionSpec, *, max_changes: int = DEFAULT_MAX_CHANGES, spark: SparkSession | None = None,
          capture_first: bool = True) -> ApplyResult:
    """Capture one batch, then apply the change log to the subscriber in one transaction.

    :param max_changes: the capture's bound (publisher/capture.py; whole transactions).
    :param spark: the session to run in; default the active one, else one built from the spec (and
        stopped at the end). Not started at all when there is nothing to apply.
    :param capture_first: read the slot first (the default); False applies what the log already holds.
    :raises ConflictError: a change conflicts (the subscriber and the slot are as they were).
    """
    began = time.monotonic()
    result = ApplyResult(spec.subscription)
    try:
        _run(spec, result, max_changes, spark, capture_first, began)
    except ApplyBusyError:
        raise  # another apply runs: not a failure of the subscription
    except Exception as e:  # the job boundary: every failure is recorded, as a readable error
        error = e if isinstance(e, RowFilterError) else _unexpected(e, result)
        _record_failure(spec, error)
        if error is e:
            raise
        raise error from e
    result.duration_ms = round((time.monotonic() - began) * 1000)
    log.info("applied %s: %s", spec.subscription, json.dumps(result.tables))
    return result


def _run(spec: SubscriptionSpec, result: ApplyResult, max_changes: int, spark: SparkSession | None,
         capture_first: bool, began: float) -> None:
    change_log = ChangeLog(spec.change_log_dir())
    with connect(spec.subscriber, "subscriber", spec) as sub:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        subscription = store.require_subscription()
        with _apply_lock(sub, spec.subscription):
            try:
                if capture_first:
                    # Under the apply's lock, with what the tables need of the log (publisher/capture.py _check_log).
                    try:
                        captured = capture(spec, max_changes=max_changes, needs=store.log_needs())
                    except SlotMissingError as e:
                        # Tables past i hold positions read from the lost slot: refresh alone refuses, the
                        # fix is a new slot and a new copy of them (refresh --recreate-slot).
                        stranded = [r for r in store.tables() if r.state is not SyncState.INIT]
                        if stranded:
                            raise slot_lost(spec, e.slot, stranded) from None
                        raise
                    result.capture = captured.summary()
                    result.lag_bytes, result.lag_seconds = captured.lag_bytes, captured.lag_seconds
                _apply_locked(spec, sub, store, subscription, change_log, result, spark, began)
            except BaseException:
                if not sub.broken and sub.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    sub.rollback()
                raise


def _apply_locked(spec: SubscriptionSpec, sub: psycopg.Connection, store: StateStore, subscription: SubscriptionRow,
                  change_log: ChangeLog, result: ApplyResult, spark: SparkSession | None,
                  began: float) -> None:
    end = change_log.captured_through()
    rels = [r for r in store.tables() if r.state in APPLIED]
    result.states = {str(r.table): r.state.value for r in store.tables()}
    segments = _check_log(spec, store, change_log, end)
    if end is None or not rels:
        log.info("%s: nothing to apply (%s)", spec.subscription,
                 "no table has finished its copy" if end is not None else "nothing captured yet")
        return
    positions = {r.table: parse_lsn(r.lsn) for r in rels}
    since = min(positions.values())
    # A heartbeat's segment holds no change: Spark is not started for it (nor for nothing at all).
    counted = [(s, c) for s in segments if (c := segment_counts(s.path))[1]]
    counted, end, filtering = _one_filtering(counted, end)
    if end < since:
        # The log ends behind every table (an older log switched to in the spec, proven to miss nothing
        # they need): no change is due, and a batch ending before it starts would be recorded.
        log.info("%s: nothing to apply (the change log ends at %s, behind the tables' lowest position %s)",
                 spec.subscription, format_lsn(end), format_lsn(since))
        return
    result.start_lsn, result.end_lsn = format_lsn(since), format_lsn(end)
    skip_lsn = None if subscription.skip_lsn is None else parse_lsn(subscription.skip_lsn)
    clear_stage(sub, spec.subscription)
    token = new_token(spec.subscription)
    targets: dict[int, ApplyTarget] = {}
    extra: dict[int, dict[str, int]] = {}
    skipped = False
    segments = [s for s, _ in counted]
    spans: list[RelationSpan] = []
    if segments:
        epochs = epochs_from_history([(r.lsn, r.definitions) for r in store.refreshes()], since)
        plans = []
        for index, rel in enumerate(rels):
            targets[index] = read_target(sub, rel.table, index)
            if filtering == "source":  # pgoutput judged: the changes pass through (core/apply_plan.py)
                leaves, rules = (rel.table,), (PASS_THROUGH,)
            else:
                leaves, rules = epochs.leaves(rel.table), epochs.rules(rel.table)
            plans.append(TargetPlan(index, rel.table, leaves, positions[rel.table], targets[index].column_names,
                                    targets[index].key, rules))
        plan = ApplyPlan((0,) if filtering == "source" else epochs.starts, tuple(plans), skip_lsn,
                         spec.conflict_policy)
        spans = _check_relations(spec, segments, plan, epochs, since)
        logged = [c for _, c in counted]
        from airflow_provider_rowfilter.spark.apply_frames import decide, write_stage
        from airflow_provider_rowfilter.spark.session import job_session

        # A JVM of our own lives for this one batch: a short one compiles for a short life (core/spark_settings.py).
        short = sum(c for _, c in logged) <= SHORT_BATCH_CHANGES
        with job_session(spec, "apply", spark, short_batch=short) as session:
            decided = decide(session, [str(s.path) for s in segments], plan)
            try:
                facts = decided.facts()
                for index, published, first in facts.column_sets:
                    targets[index].check_published(published, first)
                if facts.unkeyed:  # an UPDATE or DELETE for a table without a key: the first in commit order
                    index, (first, kind) = min(facts.unkeyed.items(), key=lambda u: u[1])
                    raise targets[index].not_updatable(kind, first)
                extra, skipped, result.changes = facts.counts, facts.skipped, facts.changes
                write_stage(decided.staged(token), executor_conninfo(
                    spec.subscriber, PASSWORD_ENV["subscriber"], f"rowfilter:{spec.subscription}:apply"))
            finally:
                decided.release()
        result.segments = len(segments)
        result.transactions = sum(t for t, _ in logged)
    faults.point("apply-after-stage")
    with sub.transaction():
        # Lock the rows first, then read them: read before the lock, a resync committed in between would be missed.
        store.lock_tables()
        current = {r.table: r for r in store.tables() if r.state in APPLIED}
        _replica_role(sub)
        conflicts: list[ConflictError] = []
        counts: dict[TableName, TableCounts] = {}
        for index, rel in enumerate(rels):
            now = current.get(rel.table)
            if now is None or (now.state, now.lsn) != (rel.state, rel.lsn):
                log.warning("%s: its state moved during the batch (%s %s → %s); applied by the next batch",
                            rel.table, rel.state.value, rel.lsn, "gone" if now is None else now.state.value)
                continue
            if index in targets:
                sub.execute("SAVEPOINT rowfilter_table")
                try:
                    counts[rel.table] = StagedTable(sub, token, targets[index], spec.conflict_policy).apply()
                    sub.execute("RELEASE SAVEPOINT rowfilter_table")
                except ConflictError as e:
                    sub.execute("ROLLBACK TO SAVEPOINT rowfilter_table")
                    conflicts.append(e)
                    continue
                except psycopg.errors.DataError as e:  # SQLSTATE class 22: a value the column cannot take
                    sub.execute("ROLLBACK TO SAVEPOINT rowfilter_table")
                    raise _value_error(sub, token, targets[index], plans[index], spans, e) from e
                except (psycopg.errors.IntegrityError, psycopg.errors.ProgrammingError) as e:
                    raise _table_error(targets[index], result, e) from e
                counts[rel.table].extra = extra.get(index, {})
                faults.point("apply-mid-transaction")
            _move(store, rel, end)
        if conflicts:
            raise min(conflicts, key=lambda c: c.commit_lsn)  # the first in commit order, as PostgreSQL stops
        if skip_lsn is not None and (skipped or skip_lsn < end):
            if skipped:
                log.info("skipped the remote transaction finished at %s (rowfilter skip)", format_lsn(skip_lsn))
                result.skipped_lsn = format_lsn(skip_lsn)
            else:
                log.warning('skip-LSN of subscription "%s" cleared: no remote transaction finished at %s',
                            spec.subscription, format_lsn(skip_lsn))
            store.set_skip_lsn(None)
        result.tables = {str(t): c.as_dict() for t, c in counts.items()}
        result.duration_ms = round((time.monotonic() - began) * 1000)
        result.batch_id = store.record_batch(
            start_lsn=result.start_lsn, end_lsn=format_lsn(end), counts=result.tables, duration_ms=result.duration_ms,
            transactions=result.transactions, changes=result.changes, skipped_lsn=result.skipped_lsn,
            lag_bytes=result.lag_bytes, lag_seconds=result.lag_seconds)
        clear_stage(sub, spec.subscription)
    faults.point("apply-after-commit")
    result.states = {str(r.table): r.state.value for r in store.tables()}
    _prune(change_log, store)


def _one_filtering(counted: list[tuple[Segment, tuple[int, int]]], end: int
                   ) -> tuple[list[tuple[Segment, tuple[int, int]]], int, str]:
    """The batch's segments up to the first captured in the other mode (change_log/log.py ``segment_filtering``),
    the batch's end, and its mode: a batch is judged one way; the next batch takes the rest."""
    if not counted:
        return counted, end, "spark"
    modes = [segment_filtering(s.path) for s, _ in counted]
    cut = next((i for i, m in enumerate(modes) if m != modes[0]), None)
    if cut is None:
        return counted, end, modes[0]
    log.info("the change log's filtering changes from %s to %s at %s: this batch ends there", modes[0], modes[cut],
             format_lsn(counted[cut][0].start_lsn))
    return counted[:cut], counted[cut][0].start_lsn, modes[0]


def _check_log(spec: SubscriptionSpec, store: StateStore, change_log: ChangeLog, end: int | None) -> list[Segment]:
    """The segments to apply, once the log is proven continuous from the tables' lowest position to its end.

    Refuses (ChangeLogError, nothing changed) a log with a gap, naming it and the log on record.
    A log other than the one on record (another directory, or a new one in its place) is accepted
    when nothing the tables need is missing, with a warning naming both, and recorded from now on.
    """
    needs = store.log_needs()
    segments = [] if end is None or needs.since is None else change_log.continuous(needs.since, end, needs)
    identity = change_log.identity()
    if identity is not None and identity != needs.recorded:
        if needs.recorded is not None and needs.recorded.id != identity.id:
            log.warning("subscription %s: its change log was %s (id %s); it is now %s (id %s), which holds everything "
                        "its tables need", spec.subscription, needs.recorded.location, needs.recorded.id,
                        identity.location, identity.id)
        with store.conn.transaction():
            store.record_change_log(identity)
    return segments


def _move(store: StateStore, rel: RelState, end: int) -> None:
    """The table has everything through ``end``: f → s → r (PostgreSQL's SYNCDONE, then READY), or r's position."""
    position = max(parse_lsn(rel.lsn), end)
    if rel.state is SyncState.READY:
        store.advance(rel.table, format_lsn(position))
        return
    if parse_lsn(rel.lsn) > end:
        return  # the log does not reach the copy's position yet: nothing of this table was due
    if rel.state is SyncState.FINISHED_COPY:
        store.set_state(rel.table, SyncState.SYNCHRONIZED, lsn=rel.lsn)
    store.set_state(rel.table, SyncState.READY, lsn=format_lsn(position))


def _replica_role(sub: psycopg.Connection) -> None:
    """Run as PostgreSQL's apply worker does: ordinary triggers and foreign keys do not fire (needs superuser)."""
    sub.execute("SAVEPOINT rowfilter_role")
    try:
        sub.execute("SET LOCAL session_replication_role = replica")
        sub.execute("RELEASE SAVEPOINT rowfilter_role")
    except psycopg.errors.InsufficientPrivilege:
        sub.execute("ROLLBACK TO SAVEPOINT rowfilter_role")
        log.warning("cannot set session_replication_role = replica (not a superuser): the subscriber's triggers "
                    "and foreign keys fire during apply")


def _check_relations(spec: SubscriptionSpec, segments: Sequence[Segment], plan: ApplyPlan, epochs: Epochs,
                     since: int) -> list[RelationSpan]:
    """The relations of the batch's segments (metadata only), held against the plan before any Spark work.

    :raises RelationChangedError: a change due in this batch has a relation the definitions no longer describe.
    """
    spans = [span for segment in segments for span in segment_relations(segment.path)]
    check_relations(plan, epochs, spans, since, lambda oids: _publisher_names(spec, oids))
    return spans


def _publisher_names(spec: SubscriptionSpec, oids: Sequence[int]) -> dict[int, TableName]:
    """The publisher's current names of tables by OID (which table a renamed relation was); {} when unreadable."""
    try:
        with connect(spec.publisher, "publisher", spec) as pub:
            rows = pub.execute("SELECT c.oid::int8, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
                               "ON n.oid = c.relnamespace WHERE c.oid = ANY(%s::oid[])", (list(oids),)).fetchall()
    except (RowFilterError, psycopg.Error) as e:
        log.warning("cannot read the publisher's table names (%s): relations it renamed are taken as unknown", e)
        return {}
    return {oid: TableName(schema, name) for oid, schema, name in rows}


def _value_error(sub: psycopg.Connection, token: str, target: ApplyTarget, plan: TargetPlan,
                 spans: Sequence[RelationSpan], e: psycopg.Error) -> ApplyError:
    """A staged value the subscriber's column cannot take: name the column and where the publisher began sending it.

    As PostgreSQL's apply worker reports it (``slot_store_error_callback`` in
    src/backend/replication/logical/worker.c: "processing remote data for replication target relation
    … column …"), found by casting the staged values of each column in turn.
    """
    column = rejected_column(sub, token, target)
    since = publisher_type = None
    if column is not None:
        sent = [(s.due_from(plan.position), s.column_types[s.column_names.index(column.name)]) for s in spans
                if s.name in plan.leaves and column.name in s.column_names
                and s.column_types[s.column_names.index(column.name)] != column.type_sql]
        since, publisher_type = min(((lsn, t) for lsn, t in sent if lsn is not None), default=(None, None))
    where = f'replication target relation "{target.table}"' + (f' column "{column.name}"' if column else "")
    detail = f"While applying the batch's changes to {where}"
    if since is not None:
        detail += (f": the publisher sends the column as {publisher_type}, the subscriber's column is "
                   f"{column.type_sql}, from the transaction finished at {format_lsn(since)} on")
    return ApplyError(
        primary_message(e), table=str(target.table), detail=detail + ". Nothing of the batch was applied.",
        hint=(f"change the subscriber's column to a type that takes the publisher's values (ALTER TABLE "
              f"{target.table} ALTER COLUMN {column.name} TYPE …) and run again" if column else
              f"make {target.table} in the subscriber take the publisher's values and run again")
        + "; the change log keeps the batch")


def _table_error(target: ApplyTarget, result: ApplyResult, e: psycopg.Error) -> ApplyError:
    """A statement on a subscriber table failed (a constraint, a permission): PostgreSQL's message, with the table."""
    return ApplyError(primary_message(e), table=str(target.table),
                      detail=f"While applying the batch's changes ({_batch_range(result)}) to {target.table}. "
                      "Nothing of the batch was applied.",
                      hint=f"make {target.table} in the subscriber accept the changes and run again; the change "
                      "log keeps the batch")


def _unexpected(e: BaseException, result: ApplyResult) -> ApplyError:
    """An error no layer below turned into ours: a readable ApplyError (the traceback goes to the task log)."""
    span = _batch_range(result)
    if isinstance(e, psycopg.OperationalError):
        return ApplyError(f"lost the connection to the database: {primary_message(e)}",
                          detail=f"During the batch {span}. The subscriber rolls back a transaction whose session "
                          "ends, so nothing of the batch was applied.",
                          hint="check that the subscriber is up and reachable, then run again: the change log "
                          "keeps the batch")
    if isinstance(e, psycopg.Error):
        return ApplyError(f"the subscriber refused the batch: {primary_message(e)}",
                          detail=f"During the batch {span}. Nothing of the batch was applied.",
                          hint="fix the cause in the subscriber and run again: the change log keeps the batch")
    if isinstance(e, OSError):
        return ApplyError(f"cannot use the change log: {e}", detail=f"During the batch {span}.",
                          hint="set change_log in the spec to a writable directory on durable storage and run "
                          "again; nothing was applied and the slot was not advanced past the log")
    log.error("the apply failed unexpectedly", exc_info=e)
    first = (str(e).strip().splitlines() or [""])[0][:500]
    return ApplyError(f"the apply failed: {type(e).__name__}: {first}", detail=f"During the batch {span}. "
                      "Nothing of the batch was applied.",
                      hint="the task log holds the full error; the change log keeps the batch for the next run")


def _batch_range(result: ApplyResult) -> str:
    if result.start_lsn is None:
        return "before any change was read"
    return f"of the changes after {result.start_lsn} through {result.end_lsn}"


def _record_failure(spec: SubscriptionSpec, error: RowFilterError) -> None:
    """Record ``error`` for ``status`` and the sensor, on a connection of its own (the batch's may be gone).

    When the subscriber cannot be reached, nothing can be recorded there: the error goes to the task
    log and the exit code only.
    """
    try:
        with connect(spec.subscriber, "subscriber", spec) as sub:
            if not relation_exists(sub, "subscription"):
                return
            store = StateStore(sub, spec.subscription)
            store.record_error(None, str(error))
            if error.table:
                store.record_error(TableName.parse(error.table), str(error))
    except (RowFilterError, psycopg.Error) as e:
        log.error("could not record the error in the subscriber (%s); it is only in this log and the exit code",
                  e)


def _prune(change_log: ChangeLog, store: StateStore) -> None:
    """Remove segments every table is past (none while a table waits for its copy: its position is not known).

    The newest segment stays: its name records where the log ends (change_log/log.py ``captured_through``).
    """
    rels = store.tables()
    if not rels or any(r.state not in APPLIED or r.lsn is None for r in rels):
        return
    floor = min(parse_lsn(r.lsn) for r in rels)
    for segment in change_log.segments()[:-1]:
        if segment.end_lsn <= floor:
            segment.path.unlink(missing_ok=True)


def _apply_lock(conn: psycopg.Connection, subscription: str) -> AbstractContextManager[None]:
    """One apply of a subscription at a time (a session advisory lock in the subscriber)."""
    return _unlocking(conn, job_lock(conn, subscription, APPLY_LOCK, lambda: ApplyBusyError(
        f"another apply of subscription {subscription!r} is running",
        hint="let it finish; the incremental DAG runs one at a time (max_active_runs=1)")))


@contextmanager
def _unlocking(conn: psycopg.Connection, lock: AbstractContextManager[None]) -> Iterator[None]:
    """``lock``, released unless the connection broke (the server ended the session, and its lock, already):
    releasing on a dead connection would replace the batch's error with "the connection is lost"."""
    lock.__enter__()
    try:
        yield
    except BaseException:
        if not conn.broken:
            lock.__exit__(*sys.exc_info())
        raise
    lock.__exit__(None, None, None)


def apply_parser() -> argparse.ArgumentParser:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--max-changes", type=positive, default=DEFAULT_MAX_CHANGES,
                   help=f"bound of the capture (slot rows; whole transactions; default {DEFAULT_MAX_CHANGES})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the batch summary as JSON (exit status: jobs/exit_status.py)."""
    setup_logging()

    def body() -> int:
        args, spec = parse(apply_parser(), argv)
        result = apply(spec, max_changes=args.max_changes)
        print(json.dumps(result.summary()))
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
