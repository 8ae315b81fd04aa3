"""ApplyChanges: the slot drained to the subscriber in bounded batches, with PostgreSQL's row-filter semantics, exactly once.

A run first reads how far the publisher has flushed its WAL (its *target*), then repeats one bounded
batch until everything committed before that point is applied, or until the run's time budget is
spent (checked between batches; a batch is never cut). A batch captures at most ``max_changes`` slot
rows into the change log (publisher/capture.py), then applies a slice of about ``max_changes``
changes of what the log holds past each table's position (whole segments, so whole transactions):
Spark judges and reduces the changes (spark/apply_frames.py), or, for a batch the publisher judged
(``filtering: source``), the job's own process reduces them (change_log/net_effect.py); the net effect
is staged in the subscriber, and ONE subscriber transaction writes every table
(subscriber/apply_target.py), moves every table's position and state (``f`` → ``s`` → ``r``) and
records the batch. Every batch of a run shares one Spark session, started by the first batch that
needs Spark. Killed anywhere, a
rerun starts from the positions the last committed batch left and reads the same log again: nothing
is lost or applied twice (docs/apply.md).

Prints one JSON line: the run's summary (each batch is also kept in ``rowfilter.batch_history``).
"""

from __future__ import annotations

import argparse
import contextvars
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import psycopg

from airflow_provider_rowfilter.change_log.identity import LogNeeds
from airflow_provider_rowfilter.change_log.log import (
    ChangeLog,
    Segment,
    segment_counts,
    segment_filtering,
    segment_identities,
    segment_relations,
)
from airflow_provider_rowfilter.change_log.net_effect import reduce_batch
from airflow_provider_rowfilter.connection import connect, primary_message
from airflow_provider_rowfilter.core import faults
from airflow_provider_rowfilter.core.apply_plan import (
    PASS_THROUGH,
    ApplyPlan,
    BatchFacts,
    Epochs,
    RelationSpan,
    TargetPlan,
    check_identities,
    check_relations,
    epochs_from_history,
)
from airflow_provider_rowfilter.core.errors import RowFilterError, UnreachableError
from airflow_provider_rowfilter.core.humane import ProgressReport, duration, report_progress, size
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.publication_state import changes, drift_error
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spark_settings import (
    COLLECTED_BATCH_CHANGES,
    IN_PROCESS_BATCH_CHANGES,
    SHORT_BATCH_CHANGES,
)
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.jobs.arguments import parse, parser, positive, seconds, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import run_job
from airflow_provider_rowfilter.jobs.refresh import slot_lost
from airflow_provider_rowfilter.publisher.capture import DEFAULT_MAX_CHANGES, CaptureResult, capture
from airflow_provider_rowfilter.publisher.capture_objects import SlotMissingError
from airflow_provider_rowfilter.publisher.catalog_reader import read_publication_state
from airflow_provider_rowfilter.publisher.slot_health import WAL_END
from airflow_provider_rowfilter.subscriber.apply_target import (
    ApplyTarget,
    ConflictError,
    StagedTable,
    TableCounts,
    clear_stage,
    copy_stage_rows,
    new_token,
    read_target,
    rejected_column,
)
from airflow_provider_rowfilter.subscriber.copy_target import executor_conninfo
from airflow_provider_rowfilter.subscriber.replica_role import replica_role
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


class SparkNeeded(Exception):  # noqa: N818 - not an error: what a run without Spark reports when it stops
    """A run without Spark (:func:`apply` ``without_spark``) reached what only the job can do: a batch that
    needs Spark, or a change log here that is not the one on record. That batch wrote nothing; what
    its capture logged stays in the log for the job."""


@dataclass
class ApplyResult:
    """What one batch did, or (:meth:`add`) what a run of batches did: the JSON line, the CLI's report.

    For a run: ``start_lsn`` is its first batch's, ``end_lsn``, ``batch_id``, ``states``, the lag and
    ``capture`` its last batch's; ``segments``, ``transactions``, ``changes`` and ``tables`` (per
    table and count) are totals over its batches. ``batch_history`` keeps each batch's own.
    """

    subscription: str
    start_lsn: str | None = None
    end_lsn: str | None = None
    segments: int = 0
    transactions: int = 0
    changes: int = 0
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    skipped_lsn: str | None = None
    lag_bytes: int | None = None  # from the last capture: the publisher's WAL past what the slot confirmed
    lag_seconds: float | None = None  # from the last capture: age of the last transaction captured
    duration_ms: int = 0
    batch_id: int | None = None
    capture: dict | None = None
    batches: int = 0  # batches recorded in batch_history by this run
    batch_ids: list[int] = field(default_factory=list)
    target_lsn: str | None = None  # the publisher's WAL flush position when the run started: what it drains to
    drained: bool = False  # everything committed before target_lsn (or, without a capture, logged) is applied
    budget_exhausted: bool = False  # the time budget stopped the run before it drained
    time_budget: float | None = None  # seconds
    disabled: bool = False  # the subscription is disabled (ALTER SUBSCRIPTION … DISABLE): nothing was applied

    @property
    def changed_tables(self) -> list[str]:
        return sorted(t for t, c in self.tables.items()
                      if any(c.get(k) for k in ("insert", "update", "delete", "truncate")))

    def summary(self) -> dict:
        return {**asdict(self), "changed_tables": self.changed_tables}

    def add(self, batch: ApplyResult) -> None:
        """Count ``batch`` (one of this run's) into the run's totals."""
        if batch.capture is not None:
            self.capture, self.lag_bytes, self.lag_seconds = batch.capture, batch.lag_bytes, batch.lag_seconds
        if batch.states:
            self.states = batch.states
        if batch.batch_id is None:
            return
        self.batches += 1
        self.batch_ids.append(batch.batch_id)
        self.batch_id, self.end_lsn = batch.batch_id, batch.end_lsn
        self.start_lsn = self.start_lsn or batch.start_lsn
        self.segments += batch.segments
        self.transactions += batch.transactions
        self.changes += batch.changes
        self.skipped_lsn = batch.skipped_lsn or self.skipped_lsn
        for table, counts in batch.tables.items():
            self.tables[table] = dict(Counter(self.tables.get(table, {})) + Counter(counts))


def apply(spec: SubscriptionSpec, *, max_changes: int = DEFAULT_MAX_CHANGES, spark: SparkSession | None = None,
          capture_first: bool = True, time_budget: float | None = None, without_spark: bool = False,
          subscriber: psycopg.Connection | None = None) -> ApplyResult:
    """Apply the slot to the subscriber in batches, each in one transaction, until the run's target or budget.

    :param max_changes: each batch's bound: the capture's (slot rows, whole transactions;
        publisher/capture.py) and about that many changes of the log applied at once.
    :param spark: the session to run in; default the active one, else one built from the spec (and
        stopped at the end). Not started at all when no batch needs it (a batch with a change to judge,
        or a batch the publisher judged of more than IN_PROCESS_BATCH_CHANGES changes).
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
        (jobs/verify.py).
    :raises ConflictError: a change conflicts (that batch changed neither the subscriber nor the
        slot; the run's earlier batches stay committed).
    """
    began = time.monotonic()
    result = ApplyResult(spec.subscription, time_budget=time_budget)
    batches: list[ApplyResult] = []
    try:
        _run(spec, result, batches, max_changes, _Session(spec, spark, allowed=not without_spark), capture_first,
             began, time_budget, subscriber)
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


def _run(spec: SubscriptionSpec, result: ApplyResult, batches: list[ApplyResult], max_changes: int,
         session: _Session, capture_first: bool, began: float, time_budget: float | None,
         subscriber: psycopg.Connection | None = None) -> None:
    change_log = ChangeLog(spec.change_log_dir())
    given = nullcontext(subscriber) if subscriber is not None else connect(spec.subscriber, "subscriber", spec)
    with given as sub, session:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        if not store.require_subscription().enabled:  # ALTER SUBSCRIPTION … DISABLE: no apply worker runs
            result.disabled = True
            log.warning("%s: the subscription is disabled (`rowfilter disable`): nothing was applied; its slot keeps "
                        "the changes until `rowfilter enable`", spec.subscription)
            return
        with _apply_lock(sub, spec.subscription):
            if not session.allowed:
                _require_recorded_log(change_log, store)
            ahead = _CaptureAhead(spec, store, max_changes)
            try:
                target = _flush_position(spec) if capture_first else None
                result.target_lsn = None if target is None else format_lsn(target)
                captured_all = not capture_first
                first = None
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
                        batch.lag_bytes, batch.lag_seconds = captured.lag_bytes, captured.lag_seconds
                        # Not cut by the bound, or the slot at the target: every transaction committed before
                        # it is in the log (the slot returns them in commit order). The second half stops a run
                        # whose bound is a transaction or two from chasing those committed after the target.
                        captured_all = not captured.more or parse_lsn(captured.end_lsn) >= target
                        if not captured_all and (time_budget is None or time.monotonic() - began < time_budget):
                            ahead.start(target)  # the next batch's capture, while this one is applied
                    applied_all = _apply_locked(spec, sub, store, store.require_subscription(), change_log, batch,
                                                session, batch_began, max_changes, prune=not ahead.running)
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
        return parse_lsn(pub.execute(f"SELECT {WAL_END}::text").fetchone()[0])  # replayed, on a standby


class _CaptureAhead:
    """A run's captures: each bounded batch's, ending at the first commit at or past the run's target, under
    the apply's lock, with what the tables need of the log (publisher/capture.py ``_check_log``).

    From the second batch of a draining run on, the next batch's capture runs in a thread of its own (its
    own publisher connection) while this batch is reduced and applied: the capture waits on the
    publisher's decoding and the apply on the subscriber, and each used to wait for the other. The
    tables' needs are read before it starts, on the run's subscriber connection; they only move
    forward, so the capture checks the log against positions at or behind the tables' own. What the
    apply writes is whole before the thread reads it and what the capture writes is invisible until it
    is renamed into the log (change_log/log.py), and segments are pruned only while no capture runs, so
    its continuity check never meets a segment being removed.
    """

    def __init__(self, spec: SubscriptionSpec, store: StateStore, max_changes: int) -> None:
        self.spec, self.store, self.max_changes = spec, store, max_changes
        self.pending: Future[CaptureResult] | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def running(self) -> bool:
        return self.pending is not None

    def start(self, target: int | None) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"rowfilter-capture-{self.spec.subscription}")
        # In the run's context: what connection.py ``in_task`` handed the run (the passwords of an operator's
        # task) is a context variable, which a thread of the pool would not see otherwise.
        self.pending = self._pool.submit(contextvars.copy_context().run, self._capture, target, self.store.log_needs())

    def take(self, target: int | None) -> CaptureResult:
        """The batch's capture: the one started ahead, else one now."""
        pending, self.pending = self.pending, None
        try:
            return self._capture(target, self.store.log_needs()) if pending is None else pending.result()
        except SlotMissingError as e:
            # Tables past i hold positions read from the lost slot: refresh alone refuses, the
            # fix is a new slot and a new copy of them (refresh --recreate-slot).
            stranded = [r for r in self.store.tables() if r.state is not SyncState.INIT]
            if stranded:
                raise slot_lost(self.spec, e.slot, stranded) from None
            raise

    def finish(self) -> None:
        """Wait for a capture still running (its segment stays in the log for the next run)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception as e:  # the run already fails or stops for its own reason
                log.warning("the capture ahead of the next batch failed too: %s", e)
        if self._pool is not None:
            self._pool.shutdown()

    def _capture(self, target: int | None, needs: LogNeeds) -> CaptureResult:
        return capture(self.spec, max_changes=self.max_changes,
                       upto_lsn=None if target is None else format_lsn(target), needs=needs)


class _Session(ExitStack):
    """The run's one Spark session: started by the first batch that needs Spark, kept for the others
    (stopped when the run ends); ``allowed`` False: that batch raises :class:`SparkNeeded` instead."""

    def __init__(self, spec: SubscriptionSpec, spark: SparkSession | None, *, allowed: bool = True) -> None:
        super().__init__()
        self.spec, self.spark, self.allowed = spec, spark, allowed
        self.session: SparkSession | None = None

    def get(self, *, short_batch: bool) -> SparkSession:
        """The session; ``short_batch`` (its JVM compiles for a short life) counts only when it is started here."""
        if not self.allowed:
            raise SparkNeeded(f"subscription {self.spec.subscription}: a batch needs Spark")
        if self.session is None:
            from airflow_provider_rowfilter.spark.session import job_session

            self.session = self.enter_context(job_session(self.spec, "apply", self.spark, short_batch=short_batch))
        return self.session


def _require_recorded_log(change_log: ChangeLog, store: StateStore) -> None:
    """Raise :class:`SparkNeeded` unless ``change_log`` is the log the subscriber records (same id)."""
    recorded, here = store.log_needs().recorded, change_log.identity()
    if recorded is None or here is None or here.id != recorded.id:
        raise SparkNeeded(f"subscription {store.subscription}: the change log at {change_log.directory} is not "
                          f"the one on record ({'none yet' if recorded is None else recorded.location})")


def _slice(counted: list[tuple[Segment, tuple[int, int]]], max_changes: int) -> int:
    """How many of the due segments (with their counts) one batch applies: about ``max_changes`` changes.

    Whole segments (whole transactions), at least one with changes; so a backlog already in the log
    (captured by a run that stopped before applying it) is applied in bounded batches too.
    """
    changes = 0
    for taken, (_, (_, n)) in enumerate(counted):
        if n and changes and changes + n > max_changes:
            return taken
        changes += n
    return len(counted)


def _apply_locked(spec: SubscriptionSpec, sub: psycopg.Connection, store: StateStore, subscription: SubscriptionRow,
                  change_log: ChangeLog, result: ApplyResult, session: _Session, began: float,
                  max_changes: int, *, prune: bool = True) -> bool:
    """One batch: a slice of the log past the tables' positions, applied in one subscriber transaction.

    Returns whether the batch reached the log's end (False: more of the log is due). ``prune`` False:
    the segments it applied stay until no capture runs (:class:`_CaptureAhead`).
    """
    end = change_log.captured_through()
    rels = [r for r in store.tables() if r.state in APPLIED]
    result.states = {str(r.table): r.state.value for r in store.tables()}
    segments = _check_log(spec, store, change_log, end)
    if end is None or not rels:
        log.info("%s: nothing to apply (%s)", spec.subscription,
                 "no table has finished its copy" if end is not None else "nothing captured yet")
        return True
    positions = {r.table: parse_lsn(r.lsn) for r in rels}
    since = min(positions.values())
    counted = [(s, segment_counts(s.path)) for s in segments]
    log_end = end
    counted, end, filtering = _one_filtering(counted, end)
    if end < since:
        # The log ends behind every table (an older log switched to in the spec, proven to miss nothing
        # they need): no change is due, and a batch ending before it starts would be recorded.
        log.info("%s: nothing to apply (the change log ends at %s, behind the tables' lowest position %s)",
                 spec.subscription, format_lsn(end), format_lsn(since))
        return True
    taken = _slice(counted, max_changes)
    whole = taken == len(counted) and end == log_end
    if taken < len(counted):
        counted = counted[:taken]
        end = counted[-1][0].end_lsn
    # A heartbeat's segment holds no change: Spark is not started for it (nor for nothing at all).
    counted = [(s, c) for s, c in counted if c[1]]
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
        spans = _check_relations(spec, segments, plan, epochs, since, filtering)
        if filtering == "spark":
            _check_publications(spec, epochs, result)
            if spec.publications_ddl:  # the publisher does not know them: it could not refuse what they forbid
                check_identities(plan, epochs, lambda: [i for s in segments for i in segment_identities(s.path)])
        logged = [c for _, c in counted]
        logged_changes = sum(c for _, c in logged)
        conninfo = executor_conninfo(spec.subscriber, "subscriber", f"rowfilter:{spec.subscription}:apply")
        paths = [str(s.path) for s in segments]
        if filtering == "source" and logged_changes <= IN_PROCESS_BATCH_CHANGES:
            # pgoutput judged every change: the batch is reduced here, without Spark (change_log/net_effect.py).
            facts, collected = reduce_batch(paths, plan, token)
            extra, skipped, result.changes = _checked(facts, targets)
            copy_stage_rows(collected, conninfo)
        else:
            # A JVM of our own that lives for one short batch compiles for a short life (core/spark_settings.py).
            short = whole and (result.capture is None or not result.capture["more"]) \
                and logged_changes <= SHORT_BATCH_CHANGES
            spark = session.get(short_batch=short)
            from airflow_provider_rowfilter.spark.apply_frames import decide, write_stage

            # A small batch is judged and staged by one Spark action, its rows COPYed from here (docs/apply.md).
            small = logged_changes <= COLLECTED_BATCH_CHANGES
            decided = decide(spark, paths, plan)
            try:
                facts, collected = decided.collected(token) if small else (decided.facts(), None)
                extra, skipped, result.changes = _checked(facts, targets)
                if collected is None:
                    write_stage(decided.staged(token), conninfo)
                else:
                    copy_stage_rows(collected, conninfo)
            finally:
                decided.release()
        result.segments = len(segments)
        result.transactions = sum(t for t, _ in logged)
    faults.point("apply-after-stage")
    with sub.transaction():
        # Lock the rows first, then read them: read before the lock, a resync committed in between would be missed.
        store.lock_tables()
        current = {r.table: r for r in store.tables() if r.state in APPLIED}
        replica_role(sub, "apply", tables=[rel.table for index, rel in enumerate(rels) if index in targets])
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
    if prune:
        _prune(change_log, store)
    return whole


def _checked(facts: BatchFacts, targets: dict[int, ApplyTarget]) -> tuple[dict[int, dict[str, int]], bool, int]:
    """What the batch's facts let through: each table takes its published columns, and a table without a key
    gets no UPDATE or DELETE it cannot find (the first in commit order raises); returns the per-table counts,
    whether the transaction being skipped is in the batch, and its number of changes."""
    for index, published, first in facts.column_sets:
        targets[index].check_published(published, first)
    if facts.unkeyed:
        index, (first, kind) = min(facts.unkeyed.items(), key=lambda u: u[1])
        raise targets[index].not_updatable(kind, first)
    return facts.counts, facts.skipped, facts.changes


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


def _check_relations(spec: SubscriptionSpec, segments: Sequence[Segment], plan: ApplyPlan, epochs: Epochs,
                     since: int, filtering: str) -> list[RelationSpan]:
    """The relations of the batch's segments (metadata only), held against the plan before any Spark work.

    Read through the subscription's own publications (``filtering`` source), the slot also sends tables
    added to them since the last refresh: those are told from renamed ones by the publisher's catalog.

    :raises RelationChangedError: a change due in this batch has a relation the definitions no longer describe.
    """
    spans = [span for segment in segments for span in segment_relations(segment.path)]
    known = sorted({TableName.parse(n) for doc in epochs.documents for e in doc["tables"]
                    for n in (e["table"], *e["leaves"])}, key=str)
    check_relations(plan, epochs, spans, since, lambda oids: _publisher_names(spec, oids),
                    (lambda: _all_present(spec, known)) if filtering == "source" else None)
    return spans


def _check_publications(spec: SubscriptionSpec, epochs: Epochs, result: ApplyResult) -> None:
    """Judged in Spark, the definitions of the last refresh must still be the publisher's (core/publication_state.py).

    One query on the publisher, after this batch's capture: when it still says what the refresh recorded,
    every change captured so far was committed before any ALTER still to come, and is judged as pgoutput
    would; when not, the batch stops untouched.

    :raises PublicationChangedError: naming each publication and table and what changed.
    """
    recorded = epochs.documents[-1].get("publisher") if epochs.documents else None
    if recorded is None:
        return  # definitions from a publications file (the user's to change), or recorded before the check
    tables = [TableName.parse(t) for t in recorded["present"]]
    with connect(spec.publisher, "publisher", spec) as pub:
        found = changes(recorded, read_publication_state(pub, spec.publication_names, tables))
    if found:
        raise drift_error(spec.subscription, format_lsn(epochs.starts[-1]), found, _batch_range(result))


def _all_present(spec: SubscriptionSpec, names: Sequence[TableName]) -> bool:
    """Whether every one of the tables ``names`` exists on the publisher under that name (False when unreadable)."""
    try:
        with connect(spec.publisher, "publisher", spec) as pub:
            found = pub.execute("SELECT count(*) FROM unnest(%s::text[], %s::text[]) AS t(s, n) "
                                "JOIN pg_namespace ns ON ns.nspname = t.s "
                                "JOIN pg_class c ON c.relnamespace = ns.oid AND c.relname = t.n",
                                ([t.schema for t in names], [t.name for t in names])).fetchone()[0]
    except (RowFilterError, psycopg.Error) as e:
        log.warning("cannot read the publisher's tables (%s): a relation no refresh added is taken as renamed", e)
        return False
    return found == len(names)


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
                   help=f"bound of each batch (slot rows captured, changes applied; whole transactions; "
                   f"default {DEFAULT_MAX_CHANGES})")
    p.add_argument("--time-budget", type=seconds, default=None, metavar="SECONDS",
                   help="start no further batch after this many seconds (a batch is never cut; 0: one batch); "
                   "default: drain everything committed before the run started")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the run's summary as JSON (exit status: jobs/exit_status.py)."""
    setup_logging()

    def body() -> int:
        args, spec = parse(apply_parser(), argv)
        result = apply(spec, max_changes=args.max_changes, time_budget=args.time_budget)
        print(json.dumps(result.summary()))
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
