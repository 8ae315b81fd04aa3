"""ApplyChanges: one micro-batch from the slot to the subscriber, with PostgreSQL's row-filter semantics, exactly once.

A run captures one bounded batch from the slot into the change log (pg/capture.py), then applies
everything the log holds past each table's position: Spark judges and reduces the changes
(spark/apply_frames.py), the net effect is staged in the subscriber, and ONE subscriber transaction
writes every table (pg/apply_target.py), moves every table's position and state (``f`` → ``s`` →
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
from collections.abc import Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field

import psycopg
from psycopg.types.json import Jsonb

from airflow_provider_rowfilter.core import faults
from airflow_provider_rowfilter.core.apply_plan import ApplyPlan, TargetPlan, epochs_from_history
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec import SHORT_BATCH_CHANGES, SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.jobs.arguments import parse, parser
from airflow_provider_rowfilter.pg.apply_target import (
    ApplyTarget,
    ConflictError,
    StagedTable,
    TableCounts,
    clear_stage,
    new_token,
    read_target,
)
from airflow_provider_rowfilter.pg.capture import DEFAULT_MAX_CHANGES, capture
from airflow_provider_rowfilter.pg.change_log import ChangeLog, Segment
from airflow_provider_rowfilter.pg.copy_target import executor_conninfo
from airflow_provider_rowfilter.pg.definitions import PASSWORD_ENV, connect
from airflow_provider_rowfilter.pg.state import APPLIED, APPLY_LOCK, RelState, StateStore, job_lock, migrate

log = logging.getLogger(__name__)


class ApplyError(RowFilterError):
    """The batch cannot be applied (nothing of it was)."""


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


def apply(spec: SubscriptionSpec, *, max_changes: int = DEFAULT_MAX_CHANGES, spark=None,  # noqa: ANN001
          capture_first: bool = True) -> ApplyResult:
    """Capture one batch, then apply the change log to the subscriber in one transaction.

    :param max_changes: the capture's bound (pg/capture.py; whole transactions).
    :param spark: the session to run in; default the active one, else one built from the spec (and
        stopped at the end). Not started at all when there is nothing to apply.
    :param capture_first: read the slot first (the default); False applies what the log already holds.
    :raises ConflictError: a change conflicts (the subscriber and the slot are as they were).
    """
    began = time.monotonic()
    result = ApplyResult(spec.subscription)
    change_log = ChangeLog(spec.change_log_dir())
    with connect(spec.subscriber, "subscriber", spec) as sub:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        subscription = store.require_subscription()
        with _apply_lock(sub, spec.subscription):
            try:
                if capture_first:
                    # Under the apply's lock, with what the tables need of the log (pg/capture.py _check_log).
                    captured = capture(spec, max_changes=max_changes, needs=store.log_needs())
                    result.capture = captured.summary()
                    result.lag_bytes, result.lag_seconds = captured.lag_bytes, captured.lag_seconds
                _apply_locked(spec, sub, store, subscription, change_log, result, spark, began)
            except RowFilterError as e:
                if sub.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    sub.rollback()
                store.record_error(None, str(e))
                if isinstance(e, ConflictError | ApplyError) and e.table:
                    store.record_error(TableName.parse(e.table), str(e))
                raise
    result.duration_ms = round((time.monotonic() - began) * 1000)
    log.info("applied %s: %s", spec.subscription, json.dumps(result.tables))
    return result


def _apply_locked(spec: SubscriptionSpec, sub: psycopg.Connection, store: StateStore, subscription: dict,
                  change_log: ChangeLog, result: ApplyResult, spark, began: float) -> None:  # noqa: ANN001
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
    result.start_lsn, result.end_lsn = format_lsn(since), format_lsn(end)
    skip_lsn = None if subscription["skip_lsn"] is None else parse_lsn(subscription["skip_lsn"])
    clear_stage(sub, spec.subscription)
    token = new_token(spec.subscription)
    targets: dict[int, ApplyTarget] = {}
    extra: dict[int, dict[str, int]] = {}
    skipped = False
    # A heartbeat's segment holds no change: Spark is not started for it (nor for nothing at all).
    segments = [s for s in segments if _segment_counts(s.path)[1]]
    if segments:
        history = sub.execute("SELECT lsn::text, definitions FROM rowfilter.refresh_history WHERE subscription = %s",
                              (spec.subscription,)).fetchall()
        epochs = epochs_from_history(history, since)
        plans = []
        for index, rel in enumerate(rels):
            targets[index] = read_target(sub, rel.table, index)
            plans.append(TargetPlan(index, rel.table, epochs.leaves(rel.table), positions[rel.table],
                                    targets[index].column_names, targets[index].key, epochs.rules(rel.table)))
        plan = ApplyPlan(epochs.starts, tuple(plans), skip_lsn, spec.conflict_policy)
        logged = [_segment_counts(s.path) for s in segments]
        with _session(spec, spark, sum(c for _, c in logged)) as session:
            from airflow_provider_rowfilter.spark.apply_frames import decide, write_stage

            decided = decide(session, [str(s.path) for s in segments], plan)
            try:
                facts = decided.facts()
                for index, published, first in facts.column_sets:
                    targets[index].check_published(published, first)
                extra, skipped, result.changes = facts.counts, facts.skipped, facts.changes
                write_stage(decided.staged(token), executor_conninfo(
                    spec.subscriber, PASSWORD_ENV["subscriber"], f"rowfilter:{spec.subscription}:apply"))
            finally:
                decided.release()
        result.segments = len(segments)
        result.transactions = sum(t for t, _ in logged)
    faults.point("apply-after-stage")
    with sub.transaction():
        current = {r.table: r for r in store.tables() if r.state in APPLIED}
        sub.execute("SELECT 1 FROM rowfilter.subscription_rel WHERE subscription = %s FOR UPDATE",
                    (spec.subscription,))
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
        sub.execute("UPDATE rowfilter.subscription SET applied_lsn = %s, last_error = NULL, updated_at = now() "
                    "WHERE name = %s", (format_lsn(end), spec.subscription))
        result.batch_id = sub.execute(
            """INSERT INTO rowfilter.batch_history (subscription, start_lsn, end_lsn, counts, duration_ms,
                   transactions, changes, skipped_lsn, lag_bytes, lag_seconds)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
            (spec.subscription, result.start_lsn, result.end_lsn, Jsonb(result.tables), result.duration_ms, result.transactions,
             result.changes, result.skipped_lsn, result.lag_bytes, result.lag_seconds)).fetchone()[0]
        clear_stage(sub, spec.subscription)
    faults.point("apply-after-commit")
    result.states = {str(r.table): r.state.value for r in store.tables()}
    _prune(change_log, store)


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


def _segment_counts(path) -> tuple[int, int]:  # noqa: ANN001
    """(transactions, changes) of a segment: its metadata's transactions, the footer's row count."""
    import pyarrow.parquet as pq

    from airflow_provider_rowfilter.pg.change_log import METADATA_KEY

    footer = pq.read_metadata(path)
    raw = (footer.metadata or {}).get(METADATA_KEY.encode())
    facts = json.loads(raw) if raw else {}
    return int(facts.get("transactions", 0)), footer.num_rows


def _prune(change_log: ChangeLog, store: StateStore) -> None:
    """Remove segments every table is past (none while a table waits for its copy: its position is not known).

    The newest segment stays: its name records where the log ends (pg/change_log.py ``captured_through``).
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
    return job_lock(conn, subscription, APPLY_LOCK, lambda: ApplyError(
        f"another apply of subscription {subscription!r} is running",
        hint="let it finish; the incremental DAG runs one at a time (max_active_runs=1)"))


@contextmanager
def _session(spec: SubscriptionSpec, spark, changes: int):  # noqa: ANN001, ANN202
    """The session to apply ``changes`` logged changes in: the caller's, the active one, else one of our own."""
    from pyspark.sql import SparkSession

    from airflow_provider_rowfilter.spark.session import build_session

    existing = spark or SparkSession.getActiveSession()
    if existing is not None:
        yield existing
        return
    # A JVM of our own lives for this one batch: a short one compiles for a short life (core/spec.py).
    session = build_session(f"rowfilter-apply-{spec.subscription}", spec.spark_master, spec.spark_conf,
                            short_batch=changes <= SHORT_BATCH_CHANGES)
    try:
        yield session
    finally:
        session.stop()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def apply_parser() -> argparse.ArgumentParser:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--max-changes", type=_positive, default=DEFAULT_MAX_CHANGES,
                   help=f"bound of the capture (slot rows; whole transactions; default {DEFAULT_MAX_CHANGES})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the batch summary as JSON."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args, spec = parse(apply_parser(), argv)
    try:
        result = apply(spec, max_changes=args.max_changes)
    except RowFilterError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
