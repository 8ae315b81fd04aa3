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
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from airflow.configuration import conf

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.spec_values import parse_size
from airflow_provider_rowfilter.dag_factory import DAG_KINDS, SPEC_PATTERNS, AirflowSettings, SubscriptionFile
from airflow_provider_rowfilter.hooks.rowfilter import RowFilterHook
from airflow_provider_rowfilter.humane import duration, size
from airflow_provider_rowfilter.plugins import health, lag_chart
from airflow_provider_rowfilter.publisher.slot_health import read_slot
from airflow_provider_rowfilter.spec_placeholders import lenient_keys, lenient_settings, placeholder_ids
from airflow_provider_rowfilter.subscriber.state_reader import Overview, StateReader

BATCHES_SHOWN = 10
#: The spec's default ``retained_wal_warning`` (core/spec.py), for a file that cannot be read.
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
    return _read(view, Reads(spec.subscriber_conn_id, spec.publisher_conn_id, settings.max_batch_age, limit), failures)


@dataclass(frozen=True)
class Reads:
    """Where a subscription is read and what it is judged by."""

    subscriber_conn_id: str | None
    publisher_conn_id: str | None
    max_batch_age: float | None = None
    max_retained_bytes: int | None = None
    spec_error: str | None = None


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
    if row is not None and reads.publisher_conn_id:
        try:
            with RowFilterHook.endpoint(reads.publisher_conn_id, "publisher").connect(connect_timeout=5) as conn:
                current_text, slot = read_slot(conn, row.slot_name)
            current = parse_lsn(current_text)
            view.slot = slot.as_dict()
        except (RowFilterError, psycopg.Error) as e:
            view.slot_error = _first_line(e)
    now = overview.now if overview is not None else dt.datetime.now(dt.timezone.utc)
    view.measured_at = when(now)
    if overview is not None:
        _fill(view, overview, current, now)
    view.failed_task = failures.failed_task
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
        syncing=[f"{t['table']} ({t['state']})" for t in view.tables if t["state"] != "r"])
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
            "rows_copied": t.rows_copied, "last_error": t.last_error, "updated_at": when(t.updated_at)})
    view.batches = [{"id": b.id, "finished_at": when(b.finished_at), "end_lsn": b.end_lsn, "changes": b.changes,
                     "transactions": b.transactions, "lag_seconds": b.lag_seconds, "duration_ms": b.duration_ms,
                     "skipped_lsn": b.skipped_lsn} for b in overview.batches]


def invalid_view(path: Path, error: Exception, dag_id: str, failures: RunFacts) -> SubscriptionView:
    """A spec file the factory cannot build: its error, its placeholder's failed run and, when the file still
    names its subscription and connections (spec_placeholders.py ``lenient_keys``), the subscription's state,
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
    """The DAG an invalid file's incremental sync stands under (spec_placeholders.py)."""
    ids = placeholder_ids(path, set(), DAG_KINDS)
    return next((dag_id for dag_id, kind in ids.items() if kind in ("incremental_sync", None)), next(iter(ids)))


# --- Airflow's metadata: the incremental sync's runs ------------------------------------------------------
@dataclass(frozen=True)
class RunFacts:
    """The incremental sync's last run when it failed (its failed task), and the failed runs of the window."""

    failed_task: dict[str, Any] | None = None
    failed_at: tuple[dt.datetime, ...] = ()

    def describe(self) -> str | None:
        t = self.failed_task
        return None if t is None else f"the last run of {t['dag_id']} failed ({t['task_id']}, {t['end_date']})"


def run_facts(dag_id: str, session: Any, now: dt.datetime) -> RunFacts:
    """What Airflow's metadata database says of ``dag_id``'s runs (never raises: the page shows the rest)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    try:
        since = now - dt.timedelta(seconds=WINDOW_SECONDS)
        failed_at = tuple(sorted(
            end for end in session.scalars(select(DagRun.end_date).where(
                DagRun.dag_id == dag_id, DagRun.state == "failed", DagRun.end_date >= since)) if end is not None))
        last = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.state.in_(("success", "failed")))
                               .order_by(DagRun.run_after.desc()).limit(1)).first()
        if last is None or last.state != "failed":
            return RunFacts(None, failed_at)
        ti = session.scalars(select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == last.run_id, TaskInstance.state == "failed")
            .order_by(TaskInstance.end_date.desc()).limit(1)).first()
        if ti is None:
            return RunFacts(None, failed_at)
        return RunFacts({"dag_id": dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "map_index": ti.map_index,
                         "try_number": ti.try_number, "end_date": when(ti.end_date)}, failed_at)
    except Exception:  # a best-effort extra: the subscriber's side is what the page is for
        session.rollback()
        return RunFacts()


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
