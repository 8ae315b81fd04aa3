"""What the Replication page shows of each subscription: read now, as one JSON document per subscription.

The subscriptions are the DAG factory's spec files (``$ROWFILTER_SUBSCRIPTIONS_DIR``, or
``subscriptions/`` in the DAGs folder, as dags/rowfilter_subscriptions.py reads them). For each, through
the file's Airflow connections: the subscriber's state in one read (subscriber/state_reader.py
``overview``: states, positions, errors, the last batches and those of the chart's window, a drop),
the publisher's slot and WAL position (publisher/slot_health.py), and from Airflow's own metadata
database the incremental sync's last run, its failed task and its failed runs of the window. The
verdict is plugins/health.py's, the chart plugins/lag_chart.py's.

Who sees what is decided as Airflow's own routes decide (api_fastapi/core_api/security.py
``requires_access_dag``): a subscription is shown to a user who may read its incremental-sync DAG,
asked with the DAG's team (``DagModel.get_team_name``); an invalid spec file's error to a user who
may also see import errors, for the DAG its placeholder stands under.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
from airflow.configuration import conf

from airflow_provider_rowfilter.connection import open_session
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.slot_retention import exposures, schedule_risks
from airflow_provider_rowfilter.core.spec.schedule import longest_gap
from airflow_provider_rowfilter.core.spec.values import CONN_ID, parse_size
from airflow_provider_rowfilter.dag_factory import DAG_KINDS, SPEC_PATTERNS, AirflowSettings, SubscriptionFile
from airflow_provider_rowfilter.dag_factory.placeholders import lenient_keys, lenient_settings, placeholder_ids
from airflow_provider_rowfilter.hooks.rowfilter import RowFilterHook
from airflow_provider_rowfilter.humane import duration, size
from airflow_provider_rowfilter.plugins import health, lag_chart
from airflow_provider_rowfilter.plugins.repairs import offered_repair
from airflow_provider_rowfilter.publisher.readiness import readiness, standby_label
from airflow_provider_rowfilter.publisher.slot_health import read_retention, read_slot
from airflow_provider_rowfilter.subscriber.state_reader import BatchRecord, Overview, StateReader, TableCheckRecord

BATCHES_SHOWN = 10
#: The spec's default ``retained_wal_warning`` (core/spec/subscription.py), for a file that cannot be read.
RETAINED_WAL_WARNING = "1GB"
#: The chart's window.
WINDOW_SECONDS = 6 * 3600
_SKIP_HINT = re.compile(r"rowfilter skip --lsn ([0-9A-Fa-f]+/[0-9A-Fa-f]+)")


def subscriptions_folder() -> Path:
    """Where the factory's spec files are (the same setting as dags/rowfilter_subscriptions.py)."""
    chosen = os.environ.get("ROWFILTER_SUBSCRIPTIONS_DIR")
    return Path(chosen) if chosen else Path(conf.get("core", "dags_folder")) / "subscriptions"


def spec_files(folder: Path) -> list[Path]:
    return sorted({p for pattern in SPEC_PATTERNS for p in folder.glob(pattern) if p.is_file()})


@dataclass
class SubscriptionView:
    """One subscription as the page shows it (its JSON document); ``error`` when it could not be read."""

    subscription: str
    spec_file: str
    dag_ids: dict[str, str] = field(default_factory=dict)
    publications: list[str] = field(default_factory=list)
    schedule: str | None = None
    health: dict[str, Any] = field(default_factory=dict)
    enabled: bool | None = None
    dropped_at: str | None = None
    measured_at: str | None = None
    applied_lsn: str | None = None
    skip_lsn: str | None = None
    last_error: str | None = None
    conflict_lsn: str | None = None
    last_batch: dict[str, Any] | None = None
    slot: dict[str, Any] | None = None
    slot_error: str | None = None
    tables: list[dict[str, Any]] = field(default_factory=list)
    batches: list[dict[str, Any]] = field(default_factory=list)
    chart_svg: str = ""
    failed_task: dict[str, Any] | None = None
    error: str | None = None
    #: the incremental sync's DAG is paused (its id)
    paused_dag: str | None = None
    #: the publisher's limits counting down on the slot (core/slot_retention.py ``Exposure.as_dict``)
    exposures: list[dict[str, Any]] = field(default_factory=list)
    #: what the apply's schedule risks against them (core/slot_retention.py ``schedule_risks``), as validate says it
    warnings: list[str] = field(default_factory=list)
    #: the standby panel: each standby of the spec, read now (publisher/readiness.py ``Readiness``)
    standbys: list[dict[str, Any]] = field(default_factory=list)
    #: the watch DAG's last lag check: ``{"state", "run_id", "end_date", "problems", …}``
    check: dict[str, Any] | None = None
    #: the incremental sync's run in state running for longer than its interval, said
    overdue_run: str | None = None
    #: what the batches' ids say when they skip (one sequence for every subscription of the subscriber)
    batch_ids_note: str | None = None
    #: the repair the state calls for, offered first (plugins/repairs.py): ``{"kind", "values", "label", "why"}``
    repair: dict[str, Any] | None = None


def when(at: dt.datetime | None) -> str | None:
    """``2025-06-01 12:34:56 UTC``: a time without its microseconds, in UTC."""
    if at is None:
        return None
    return at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def schedule_interval(schedule: str | None, now: dt.datetime) -> float | None:
    """Seconds between two runs of a cron schedule or preset (None: manual, or not a cron)."""
    if not schedule:
        return None
    try:
        from croniter import croniter

        it = croniter(schedule, now)
        first = it.get_next(dt.datetime)
        return (it.get_next(dt.datetime) - first).total_seconds()
    except Exception:  # not a cron expression croniter reads: no interval to judge by
        return None


def read_view(source: SubscriptionFile, failures: RunFacts) -> SubscriptionView:
    """The subscription of a valid spec file, read now."""
    spec, settings = source.spec, source.settings
    view = SubscriptionView(spec.subscription, str(source.path), dict(source.dag_ids), list(spec.publications),
                            settings.schedule)
    limit = parse_size(settings.max_retained_wal, "airflow: max_retained_wal") \
        if settings.max_retained_wal is not None else spec.retained_wal_warning_bytes
    return _read(view, Reads(spec.subscriber_conn_id, spec.publisher_conn_id, settings.max_batch_age, limit,
                             standbys=tuple(spec.standbys), apply_schedule=spec.apply_schedule), failures)


@dataclass(frozen=True)
class Reads:
    """Where a subscription is read and what it is judged by."""

    subscriber_conn_id: str | None
    publisher_conn_id: str | None
    max_batch_age: float | None = None
    max_retained_bytes: int | None = None
    spec_error: str | None = None
    standbys: tuple[str, ...] = ()  # the spec's standbys: Airflow connection ids or URLs
    apply_schedule: str | int | None = None


def _read(view: SubscriptionView, reads: Reads, failures: RunFacts) -> SubscriptionView:
    overview: Overview | None = None
    current = None
    if reads.subscriber_conn_id:
        try:
            with RowFilterHook.endpoint(reads.subscriber_conn_id, "subscriber").connect(connect_timeout=5) as conn:
                overview = StateReader(conn, view.subscription).overview(shown=BATCHES_SHOWN,
                                                                        window_seconds=WINDOW_SECONDS)
        except (RowFilterError, psycopg.Error) as e:
            view.error = view.error or _first_line(e)
    row = overview.reading.row if overview is not None else None
    copied = [(str(t.table), t.lsn) for t in (overview.reading.tables if overview else ()) if t.state.value == "f"
              and t.lsn]
    if row is not None and reads.publisher_conn_id:
        try:
            with RowFilterHook.endpoint(reads.publisher_conn_id, "publisher").connect(connect_timeout=5) as conn:
                current_text, slot = read_slot(conn, row.slot_name)
                retention = read_retention(conn)
                published_now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
                view.standbys = _standbys(conn, row.slot_name, reads.standbys, copied, None)
            current = parse_lsn(current_text)
            view.slot = slot.as_dict()
            if slot.exists and not slot.lost:
                view.exposures = [e.as_dict() for e in exposures(
                    retention, active=slot.active, inactive_since=slot.inactive_since, wal_status=slot.wal_status,
                    safe_wal_size=slot.safe_wal_size, now=published_now)]
            if reads.apply_schedule is not None:
                view.warnings = schedule_risks(retention, longest_gap(reads.apply_schedule), reads.apply_schedule)
        except (RowFilterError, psycopg.Error) as e:
            view.slot_error = _first_line(e)
            view.standbys = _standbys(None, row.slot_name, reads.standbys, copied, view.slot_error)
    now = overview.now if overview is not None else dt.datetime.now(dt.timezone.utc)
    view.measured_at = when(now)
    if overview is not None:
        _fill(view, overview, current, now)
    view.failed_task = failures.failed_task
    view.paused_dag = failures.paused_dag
    view.check = failures.check
    view.overdue_run = failures.overdue(schedule_interval(view.schedule, now), now)
    view.chart_svg = lag_chart.render(
        [lag_chart.Point(b.finished_at, b.changes or 0, b.lag_seconds, b.id) for b in (overview.window if overview else ())],
        failures.failed_at, now, WINDOW_SECONDS)
    facts = health.Facts(
        spec_error=reads.spec_error, read_error=None if reads.spec_error else view.error, exists=row is not None,
        dropped_at=view.dropped_at, enabled=view.enabled is not False, last_error=view.last_error,
        failed_run=failures.describe(), batch_age=view.last_batch["age_seconds"] if view.last_batch else None,
        max_batch_age=reads.max_batch_age, schedule_interval=schedule_interval(view.schedule, now),
        slot_exists=None if view.slot is None else view.slot["exists"],
        slot_lost=bool(view.slot and view.slot.get("wal_status") == "lost"),
        wal_status=view.slot.get("wal_status") if view.slot else None,
        retained_bytes=view.slot.get("retained_bytes") if view.slot else None,
        max_retained_bytes=reads.max_retained_bytes,
        past_copy=[t["table"] for t in view.tables if t["state"] != "i"],
        syncing=[f"{t['table']} ({t['state']})" for t in view.tables if t["state"] != "r"],
        paused_dag=view.paused_dag, exposures=view.exposures, overdue_run=view.overdue_run,
        check_failed=(view.check or {}).get("problems") or [] if (view.check or {}).get("state") == "failed" else [])
    view.repair = offered_repair(view)
    verdict = health.judge(facts)
    view.health = {"verdict": verdict.verdict,
                   "reasons": verdict.reasons + ([d] if reads.spec_error and (d := failures.describe()) else [])}
    return view


def _fill(view: SubscriptionView, overview: Overview, current: int | None, now: dt.datetime) -> None:
    reading = overview.reading
    if reading.row is None:
        view.dropped_at = when(overview.last_drop.dropped_at) if overview.last_drop else None
        return
    row = reading.row
    view.enabled, view.applied_lsn, view.skip_lsn, view.last_error = row.enabled, row.applied_lsn, row.skip_lsn, \
        row.last_error
    errors = [row.last_error or "", *(t.last_error or "" for t in reading.tables)]
    view.conflict_lsn = next((m.group(1) for e in errors if (m := _SKIP_HINT.search(e))), None)
    batches = sorted({b.id: b for b in (*overview.batches, *overview.window)}.values(), key=lambda b: -b.id)
    newest = batches[0] if batches else None
    if newest is not None:
        view.last_batch = {"id": newest.id, "finished_at": when(newest.finished_at), "end_lsn": newest.end_lsn,
                           "age_seconds": round(max((now - newest.finished_at).total_seconds(), 0.0), 1),
                           "lag_seconds": newest.lag_seconds}
    for t in reading.tables:
        behind = None
        if current is not None and t.lsn is not None and t.state.value in "fsr":
            behind = max(current - parse_lsn(t.lsn), 0)
        # The newest batch that reached the table's position: when its position last moved.
        moved = next((b for b in batches if t.state.value == "r" and t.lsn and b.end_lsn
                      and parse_lsn(b.end_lsn) <= parse_lsn(t.lsn)), None)
        age = None if moved is None else max((now - moved.finished_at).total_seconds(), 0.0)
        view.tables.append({
            "table": str(t.table), "state": t.state.value, "label": t.state.label, "lsn": t.lsn,
            "behind_bytes": behind, "behind": None if behind is None else size(behind),
            "last_batch_at": when(moved.finished_at) if moved else None,
            "last_batch_age_seconds": None if age is None else round(age, 1),
            "last_batch_age": None if age is None else f"{duration(age)} ago",
            "rows_copied": t.rows_copied, "last_error": t.last_error, "updated_at": when(t.updated_at),
            "last_check": _check(overview.checks.get(t.table), now),
            "filter_changed": overview.filter_changes.get(t.table)})
    view.batches = [{"id": b.id, "finished_at": when(b.finished_at), "start_lsn": b.start_lsn, "end_lsn": b.end_lsn,
                     "changes": b.changes, "transactions": b.transactions, "lag_seconds": b.lag_seconds,
                     "duration_ms": b.duration_ms, "skipped_lsn": b.skipped_lsn,
                     "schema": [f"schema: {c['text']}" for c in b.schema_changes or ()]} for b in overview.batches]
    view.batch_ids_note = batch_ids_note(overview.batches)


def _standbys(pub: psycopg.Connection | None, slot: str, standbys: tuple[str, ...],
              copied: list[tuple[str, str]], unreachable: str | None) -> list[dict[str, Any]]:
    """The standby panel: each standby of the spec read now, also while the primary is down (``pub`` None); a
    standby given by its Airflow connection id is reached through it (a URL, with the publisher's credentials,
    through libpq's own: PGPASSWORD, ~/.pgpass)."""
    if not standbys:
        return []

    def opener(standby: str) -> Any:
        if CONN_ID.match(standby):
            return lambda: RowFilterHook.endpoint(standby, "standby").connect(connect_timeout=5)
        return lambda: open_session(standby, connect_timeout=5)

    try:
        found = readiness(pub, slot, [(standby_label(s), opener(s)) for s in standbys], copied,
                          unreachable=unreachable)
    except (RowFilterError, psycopg.Error) as e:
        return [{"standby": standby_label(s), "ready": False, "role": "unreachable", "problems": [_first_line(e)],
                 "summary": f"unknown: {_first_line(e)}"} for s in standbys]
    return [{**r.as_dict(), "summary": r.summary()} for r in found]


def _check(check: TableCheckRecord | None, now: dt.datetime) -> dict[str, Any] | None:
    """A table's last verify or reconcile, as the page says it."""
    if check is None:
        return None
    r = check.result
    if check.kind == "reconcile":
        found = f"inserted {r.get('inserted', 0):,}, updated {r.get('updated', 0):,}, deleted {r.get('deleted', 0):,}"
    elif check.clean:
        found = "equal to the publisher's rows"
    else:
        found = ", ".join(f"{r.get(k, 0):,} {k}" for k in ("missing", "extra", "different") if r.get(k)) or "differs"
    age = max((now - check.checked_at).total_seconds(), 0.0)
    return {"kind": check.kind, "clean": check.clean, "lsn": check.lsn, "checked_at": when(check.checked_at),
            "said": f"{check.kind} {duration(age)} ago at {check.lsn}: {found}"}


def batch_ids_note(batches: tuple[BatchRecord, ...]) -> str | None:
    """Why the shown batches' ids skip, when they do: they come from one sequence of the subscriber
    (``rowfilter.batch_history_id_seq``, a bigserial) that every subscription of the subscriber and every reconcile
    draws from, and a batch that was rolled back (a conflict, a killed run) drew one too: PostgreSQL never hands a
    sequence value back (nextval in src/backend/commands/sequence.c is not transactional), and after a crash of the
    subscriber it may skip up to 32 values it had logged ahead (SEQ_LOG_VALS). Whether a batch is missing is told
    by positions, not ids: each batch starts where the one before it ended."""
    ordered = sorted(batches, key=lambda b: b.id)
    gaps = [(a, b) for a, b in zip(ordered, ordered[1:], strict=False) if b.id != a.id + 1]
    if not gaps:
        return None
    joined = all(a.end_lsn is not None and b.start_lsn is not None and parse_lsn(b.start_lsn) <= parse_lsn(a.end_lsn)
                 for a, b in gaps)
    listed = ", ".join(f"{a.id} → {b.id}" for a, b in gaps)
    return (f"batch ids skip ({listed}): the ids come from one sequence of the subscriber, shared by every "
            "subscription there and by reconciles, and a batch that was rolled back (a conflict, a killed run) used one "
            "too; PostgreSQL never hands a sequence value back. "
            + ("No batch is missing: each one starts where the one before it ended." if joined else
               "These batches do not start where the one before ended: see `rowfilter status` and the change log."))


def invalid_view(path: Path, error: Exception, dag_id: str, failures: RunFacts) -> SubscriptionView:
    """A spec file the factory cannot build: its error, its placeholder's failed run and, when the file still
    names its subscription and connections (dag_factory/placeholders.py ``lenient_keys``), the subscription's state,
    lag and slot, read as for a valid file: a typo does not hide where replication stands."""
    text = str(error).strip() or type(error).__name__
    known = lenient_keys(path)
    settings = lenient_settings(path, AirflowSettings.from_mapping, lambda *_: None)
    view = SubscriptionView(known.get("subscription") or path.stem, str(path), {"incremental_sync": dag_id},
                            schedule=settings.schedule, error=f"invalid spec file: {text}")
    reads = Reads(known.get("subscriber_conn_id"), known.get("publisher_conn_id"),
                  max_retained_bytes=parse_size(RETAINED_WAL_WARNING, "retained_wal_warning"),
                  spec_error=text.splitlines()[0])
    return _read(view, reads, failures)


def placeholder_dag_id(path: Path) -> str:
    """The DAG an invalid file's incremental sync stands under (dag_factory/placeholders.py)."""
    ids = placeholder_ids(path, set(), DAG_KINDS)
    return next((dag_id for dag_id, kind in ids.items() if kind in ("incremental_sync", None)), next(iter(ids)))


# --- Airflow's metadata: the incremental sync's runs ------------------------------------------------------
@dataclass(frozen=True)
class RunFacts:
    """The incremental sync's last run when it failed (its failed task), and the failed runs of the window."""

    failed_task: dict[str, Any] | None = None
    failed_at: tuple[dt.datetime, ...] = ()
    paused_dag: str | None = None  # the incremental sync, when paused
    running_since: dt.datetime | None = None  # its run in state running, since
    running_run: str | None = None
    check: dict[str, Any] | None = None  # the watch DAG's last lag check (operators/subscription_lag.py)

    def describe(self) -> str | None:
        t = self.failed_task
        if t is None:
            return None
        said = f"the last run of {t['dag_id']} failed ({t['task_id']}, {t['end_date']})"
        return said + (f": {t['reason']}" if t.get("reason") else "")

    def overdue(self, interval: float | None, now: dt.datetime) -> str | None:
        """The run in state running for longer than the schedule's interval, said (None: none, or in time)."""
        if self.running_since is None or not interval:
            return None
        running = (now - self.running_since).total_seconds()
        if running <= interval:
            return None
        return (f"run {self.running_run} has been running for {duration(running)} (since {when(self.running_since)}), "
                f"more than its schedule's interval ({duration(interval)}): a long drain, a hung apply, or a worker "
                "that was lost (Airflow marks its task failed after its heartbeat timeout)")


def run_facts(dag_id: str, session: Any, now: dt.datetime, watch_dag_id: str | None = None) -> RunFacts:
    """What Airflow's metadata database says of ``dag_id``'s runs, its pause, and the last lag check of the
    watch DAG ``watch_dag_id`` (never raises: the page shows the rest)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    try:
        since = now - dt.timedelta(seconds=WINDOW_SECONDS)
        failed_at = tuple(sorted(
            end for end in session.scalars(select(DagRun.end_date).where(
                DagRun.dag_id == dag_id, DagRun.state == "failed", DagRun.end_date >= since)) if end is not None))
        paused = session.scalar(select(DagModel.is_paused).where(DagModel.dag_id == dag_id))
        running = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.state == "running")
                                  .order_by(DagRun.start_date).limit(1)).first()
        facts = RunFacts(None, failed_at, dag_id if paused else None,
                         running.start_date if running is not None else None,
                         running.run_id if running is not None else None,
                         _last_check(session, watch_dag_id) if watch_dag_id else None)
        last = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.state.in_(("success", "failed")))
                               .order_by(DagRun.run_after.desc()).limit(1)).first()
        if last is None or last.state != "failed":
            return facts
        ti = session.scalars(select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == last.run_id, TaskInstance.state == "failed")
            .order_by(TaskInstance.end_date.desc()).limit(1)).first()
        if ti is None:
            return facts
        reason = _check_problems(session, dag_id, ti.run_id, ti.task_id) if ti.task_id == "check_lag" else None
        return replace(facts, failed_task={
            "dag_id": dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "map_index": ti.map_index,
            "try_number": ti.try_number, "end_date": when(ti.end_date), "reason": "; ".join(reason or []) or None})
    except Exception:  # a best-effort extra: the subscriber's side is what the page is for
        session.rollback()
        return RunFacts()


def _last_check(session: Any, dag_id: str) -> dict[str, Any] | None:
    """The watch DAG's last finished ``check_lag``: its state and, when it failed, what it found (the XCom ``check``
    the operator keeps before it fails), else its return value."""
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    ti = session.scalars(select(TaskInstance).where(
        TaskInstance.dag_id == dag_id, TaskInstance.task_id == "check_lag",
        TaskInstance.state.in_(("success", "failed"))).order_by(TaskInstance.end_date.desc()).limit(1)).first()
    if ti is None:
        return None
    found = _xcom(session, dag_id, ti.run_id, "check_lag", "check" if ti.state == "failed" else "return_value")
    return {"state": str(getattr(ti.state, "value", ti.state)), "run_id": ti.run_id, "end_date": when(ti.end_date),
            "problems": list((found or {}).get("problems") or []), "state_said": (found or {}).get("state"),
            "reason": (found or {}).get("reason")}


def _check_problems(session: Any, dag_id: str, run_id: str, task_id: str) -> list[str] | None:
    found = _xcom(session, dag_id, run_id, task_id, "check")
    return None if found is None else list(found.get("problems") or [])


def _xcom(session: Any, dag_id: str, run_id: str, task_id: str, key: str) -> dict[str, Any] | None:
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    value = session.scalar(select(XComModel.value).where(
        XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.task_id == task_id, XComModel.key == key))
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
