"""ApplyChanges: the slot drained to the subscriber in bounded batches, with PostgreSQL's row-filter semantics, exactly once.

A run first reads how far the publisher has flushed its WAL (its *target*), then repeats one bounded
batch until everything committed before that point is applied, or until the run's time budget is
spent (checked between batches; a batch is never cut). A batch captures at most ``max_changes`` slot
rows into the change log (flows/apply/capture_ahead.py, publisher/capture.py), then applies a slice of about
``max_changes`` changes of what the log holds past each table's position in three steps:

1. **plan** (flows/apply/batch_plan.py): the slice of the log (whole segments, so whole transactions), the
   tables it applies and the definitions of each change, checked before anything is staged;
2. **reduce** (flows/apply/reducers.py): Spark judges and reduces the changes (spark/apply_frames.py), or,
   for a batch the publisher judged (``filtering: source``), this process reduces them
   (flows/apply/net_effect.py); the net effect is staged in the subscriber;
3. **commit** (flows/apply/batch_transaction.py): ONE subscriber transaction writes every table
   (subscriber/apply_target.py), moves every table's position and state (``f`` → ``s`` → ``r``) and
   records the batch.

Every batch of a run shares one Spark session, started by the first batch that needs Spark. Killed
anywhere, a rerun starts from the positions the last committed batch left and reads the same log
again: nothing is lost or applied twice (docs/apply.md).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

import psycopg

from airflow_provider_rowfilter.change_log.log import ChangeLog
from airflow_provider_rowfilter.change_log.store import open_change_log
from airflow_provider_rowfilter.connection import connect, primary_message
from airflow_provider_rowfilter.core.errors import ApplyError, RowFilterError, UnreachableError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.batch_plan import plan_batch
from airflow_provider_rowfilter.flows.apply.batch_transaction import commit_batch
from airflow_provider_rowfilter.flows.apply.capture_ahead import CaptureAhead
from airflow_provider_rowfilter.flows.apply.reducers import reduce
from airflow_provider_rowfilter.flows.apply.result import ApplyResult
from airflow_provider_rowfilter.flows.spark_on_demand import SparkNeeded, SparkOnDemand
from airflow_provider_rowfilter.humane import ProgressReport, duration, report_progress, size
from airflow_provider_rowfilter.publisher.catalog_reader import flush_position
from airflow_provider_rowfilter.subscriber import conflicts
from airflow_provider_rowfilter.subscriber.apply_target import ConflictError
from airflow_provider_rowfilter.subscriber.change_by_change import ChangeByChange
from airflow_provider_rowfilter.subscriber.state import (
    APPLIED,
    APPLY_LOCK,
    StateStore,
    job_lock,
    migrate,
    relation_exists,
)

if TYPE_CHECKING:  # the job starts Spark only when a batch has changes to apply
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

__all__ = ["ApplyBusyError", "ApplyError", "ApplyResult", "apply"]


class ApplyBusyError(ApplyError):
    """Another apply of the subscription holds its lock (not recorded as the subscription's error)."""

    transient = True


def apply(spec: SubscriptionSpec, *, max_changes: int | None = None, spark: SparkSession | None = None,
          capture_first: bool = True, time_budget: float | None = None, without_spark: bool = False,
          subscriber: psycopg.Connection | None = None) -> ApplyResult:
    """Apply the slot to the subscriber in batches, each in one transaction, until the run's target or budget.

    :param max_changes: each batch's bound: the capture's (slot rows, whole transactions;
        None: DEFAULT_MAX_CHANGES for the first, larger ones while a backlog waits, flows/apply/capture_ahead.py;
        publisher/capture.py) and about that many changes of the log applied at once.
    :param spark: the session to run in; default the active one, else one built from the spec (and
        stopped at the end). Not started at all when no batch needs it (a batch with a change to judge,
        or a batch the publisher judged of more than IN_PROCESS_BATCH_CHANGES changes: flows/apply/reducers.py).
    :param capture_first: read the slot (the default); False applies what the log already holds.
    :param time_budget: seconds after which no further batch starts (checked between batches; a
        batch is never cut); None: run until drained; 0: one batch.
    :param without_spark: run only while no Spark is needed (what ApplyChangesOperator does in its task
        before it submits the job): batches without a change, and those the publisher judged that are
        reduced in this process, are applied as usual; the first that needs Spark raises
        :class:`SparkNeeded`, as does a change log here other than the one the
        subscriber records (the task must never capture into a log the job does not read).
    :param subscriber: run on this subscriber connection (left open), whose session may hold the apply's lock
        already (advisory locks are re-entrant): a verify applies up to its point while no other run can
        (flows/verify/verify.py).
    :raises ConflictError: a change conflicts (that batch changed neither the subscriber nor the
        slot; the run's earlier batches stay committed).
    """
    began = time.monotonic()
    result = ApplyResult(spec.subscription, time_budget=time_budget)
    batches: list[ApplyResult] = []
    try:
        _run(spec, result, batches, max_changes, SparkOnDemand(spec, spark, "apply", allowed=not without_spark),
             capture_first, began, time_budget, subscriber)
    except (ApplyBusyError, SparkNeeded):
        raise  # another apply runs, or the job must: not a failure of the subscription
    except Exception as e:  # the job boundary: every failure is recorded, as a readable error
        if result.batches:
            log.warning("%s: this run committed %d batch(es) through %s before this failure (%s)",
                        spec.subscription, result.batches, result.end_lsn, ", ".join(map(str, result.batch_ids)))
        if without_spark and isinstance(e, UnreachableError):
            raise  # the operator submits the job, which decides (and records what it meets)
        failed = batches[-1] if batches else result
        error = e if isinstance(e, RowFilterError) else _unexpected(e, failed)
        _record_failure(spec, error)
        if error is e:
            raise
        raise error from e
    result.duration_ms = round((time.monotonic() - began) * 1000)
    log.info("applied %s: %d batch(es), %d changes in %d transactions (%s → %s) in %d ms; lag %s bytes, %s s; %s",
             spec.subscription, result.batches, result.changes, result.transactions, result.start_lsn,
             result.end_lsn, result.duration_ms, result.lag_bytes, result.lag_seconds,
             "drained" if result.drained else "stopped by the time budget" if result.budget_exhausted
             else "not drained")
    return result


def _run(spec: SubscriptionSpec, result: ApplyResult, batches: list[ApplyResult], max_changes: int | None,
         spark: SparkOnDemand, capture_first: bool, began: float, time_budget: float | None,
         subscriber: psycopg.Connection | None = None) -> None:
    change_log = open_change_log(spec)
    given = nullcontext(subscriber) if subscriber is not None else connect(spec.subscriber, "subscriber", spec)
    with given as sub, spark:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        if not store.require_subscription().enabled:  # ALTER SUBSCRIPTION … DISABLE: no apply worker runs
            result.disabled = True
            log.warning("%s: the subscription is disabled (`rowfilter disable`): nothing was applied; its slot keeps "
                        "the changes until `rowfilter enable`", spec.subscription)
            return
        with apply_lock(sub, spec.subscription):
            if not spark.allowed:
                _require_recorded_log(change_log, store)
            ahead = CaptureAhead(spec, store, max_changes)
            try:
                target = _flush_position(spec) if capture_first else None
                result.target_lsn = None if target is None else format_lsn(target)
                captured_all = not capture_first
                first = None
                held: dict[str, pa.Table] = {}  # the rows of the segments this run captured, not yet applied
                while True:
                    batch = ApplyResult(spec.subscription)
                    batches.append(batch)
                    batch_began = time.monotonic()
                    if not captured_all:
                        held_back = ahead.running  # the last batch's segments were not pruned while it ran
                        captured = ahead.take(target)
                        if held_back:
                            _prune(change_log, store)
                        batch.capture = captured.summary()
                        if captured.held is not None and captured.segment is not None:
                            held[captured.segment] = captured.held
                        batch.lag_bytes, batch.lag_seconds = captured.lag_bytes, captured.lag_seconds
                        # Not cut by the bound, or the slot at the target: every transaction committed before
                        # it is in the log (the slot returns them in commit order). The second half stops a run
                        # whose bound is a transaction or two from chasing those committed after the target.
                        captured_all = not captured.more or parse_lsn(captured.end_lsn) >= target
                        if not captured_all and (time_budget is None or time.monotonic() - began < time_budget):
                            ahead.start(target, captured)  # the next batch's capture, while this one is applied
                    # the batch applies about what its capture read (a backlog already in the log: the first bound)
                    applied_all = _apply_batch(spec, sub, store, change_log, batch, spark, batch_began,
                                               ahead.max_changes,
                                               prune=not ahead.running, held=held)
                    result.add(batch)
                    if captured_all and applied_all:
                        result.drained = True
                        if first is not None:  # it reported progress: its bar completes
                            report_progress(_drain_report(spec, result, first, target, time.monotonic() - began,
                                                          final=True))
                        return
                    if first is None and batch.capture is not None:
                        first = parse_lsn(batch.capture["start_lsn"])
                    report_progress(_drain_report(spec, result, first, target, time.monotonic() - began))
                    if time_budget is not None and time.monotonic() - began >= time_budget:
                        result.budget_exhausted = True
                        log.info("%s: the time budget of %s s is spent after %d batch(es); the next run goes on "
                                 "from %s", spec.subscription, time_budget, result.batches, result.end_lsn)
                        return
            except SparkNeeded:
                raise
            except BaseException:
                report_progress(ProgressReport.failed("drain", spec.subscription))
                if not sub.broken and sub.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    sub.rollback()
                raise
            finally:
                ahead.finish()  # under the apply's lock: no capture outlives the run


def _apply_batch(spec: SubscriptionSpec, sub: psycopg.Connection, store: StateStore, change_log: ChangeLog,
                 result: ApplyResult, spark: SparkOnDemand, began: float, max_changes: int, *,
                 prune: bool = True, held: dict[str, pa.Table] | None = None) -> bool:
    """One batch, planned, reduced and committed: a slice of the log past the tables' positions, applied in
    one subscriber transaction.

    Returns whether the batch reached the log's end (False: more of the log is due). ``prune`` False:
    the segments it applied stay until no capture runs (flows/apply/capture_ahead.py). ``held``: the rows of segments this
    run captured, by path (flows/apply/reducers.py ``reduce_here``); those the batch applied are dropped from it.
    """
    batch = plan_batch(spec, sub, store, store.require_subscription(), change_log, result, max_changes)
    if batch is None:
        return True
    while True:
        staged = reduce(spec, sub, batch, result, spark, held)
        try:
            commit_batch(spec, sub, store, batch, staged, result, began)
            break
        except ChangeByChange as e:  # judged again, those tables change by change (subscriber/change_by_change.py)
            if e.targets <= batch.exact:
                raise
            batch.exact = batch.exact | e.targets
    for path in batch.paths if held is not None else ():
        held.pop(path, None)
    result.states = {str(r.table): r.state.value for r in store.tables()}
    if prune:
        _prune(change_log, store)
    return batch.whole


def _drain_report(spec: SubscriptionSpec, result: ApplyResult, first: int | None, target: int | None,
                  seconds: float, *, final: bool = False) -> ProgressReport:
    """A draining run's progress after a batch that did not finish it (``final``: after the one that did):
    batches, changes, WAL left to the run's target and the time left; its bar is the WAL from the first
    batch's start to the target."""
    line = (f"{spec.subscription}: drained {result.batches} batch(es), {result.changes:,} changes in "
            f"{duration(seconds)}")
    detail = f"{result.batches} batch(es), {result.changes:,} changes"
    done = None if result.capture is None else parse_lsn(result.capture["end_lsn"])
    if first is None or target is None or done is None or target <= first:
        return ProgressReport("drain", spec.subscription, result.batches, None,
                              detail, line, final=final)
    if final:
        done = max(done, target)
    share = min(max((done - first) / (target - first), 0.0), 1.0)
    left = f"{size(max(target - done, 0))} of WAL to the run's target {format_lsn(target)}"
    line += f"; {left} ({share:.0%} done"
    detail += f"; {left}"
    if share > 0 and not final:
        eta = f"about {duration(seconds * (1 - share) / share)} left"
        line, detail = f"{line}, {eta})", f"{detail}, {eta}"
    else:
        line += ")"
    if final:
        detail = f"{result.batches} batch(es), {result.changes:,} changes, drained in {duration(seconds)}"
    return ProgressReport("drain", spec.subscription, min(max(done - first, 0), target - first),
                          target - first, detail, line, final=final)


def _flush_position(spec: SubscriptionSpec) -> int:
    """The publisher's WAL flush position now: what the run drains to (every transaction committed before it)."""
    with connect(spec.publisher, "publisher", spec) as pub:
        return flush_position(pub)


def _require_recorded_log(change_log: ChangeLog, store: StateStore) -> None:
    """Raise :class:`SparkNeeded` unless ``change_log`` is the log the subscriber records (same id)."""
    recorded, here = store.log_needs().recorded, change_log.identity()
    if recorded is None or here is None or here.id != recorded.id:
        raise SparkNeeded(f"subscription {store.subscription}: the change log at {change_log.where} is not "
                          f"the one on record ({'none yet' if recorded is None else recorded.location})")


def _unexpected(e: BaseException, result: ApplyResult) -> ApplyError:
    """An error no layer below turned into ours: a readable ApplyError (the traceback goes to the task log)."""
    span = result.span
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
            conflicts.count_error(sub, spec.subscription, "apply_error_count")  # pg_stat_subscription_stats'
            if error.table:
                store.record_error(TableName.parse(error.table), str(error))
            if isinstance(error, ConflictError) and relation_exists(sub, "conflict_stats"):
                # PostgreSQL counts a conflict that stops the apply each time it is met (conflict.c
                # ReportApplyConflict): the batch rolled back, the count is committed on its own.
                with sub.transaction():
                    conflicts.count(sub, spec.subscription, TableName.parse(error.table), {error.kind: 1})
                    # and those the batch went on from before it stopped, once however often it is retried
                    if error.met and relation_exists(sub, "conflict_stopped"):
                        conflicts.count_stopped(sub, spec.subscription, error.batch_start, error.met)
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


def apply_lock(conn: psycopg.Connection, subscription: str) -> AbstractContextManager[None]:
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
