"""SubscriptionLagCheckOperator: fail when a subscription falls behind, so that Airflow alerts on it."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_provider_rowfilter.connection import one, open_session
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.slot_retention import (
    KEEP_FIX,
    WAY_BACK,
    exposures,
    idle_alert,
    invalidation,
    schedule_risks,
    stamp,
)
from airflow_provider_rowfilter.core.spec.schedule import longest_gap
from airflow_provider_rowfilter.core.spec.values import parse_size
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec, RowFilterHook
from airflow_provider_rowfilter.humane import duration, size
from airflow_provider_rowfilter.operators.apply_dag import ApplyDag, apply_dag
from airflow_provider_rowfilter.operators.metrics import lag_metrics
from airflow_provider_rowfilter.operators.task_errors import clear_errors
from airflow_provider_rowfilter.publisher.readiness import readiness
from airflow_provider_rowfilter.publisher.slot_health import read_retention, read_slot
from airflow_provider_rowfilter.subscriber.state import apply_running_for, job_lock_key
from airflow_provider_rowfilter.subscriber.state_reader import RelState, StateReader

if TYPE_CHECKING:
    from airflow.sdk import Context


#: The lag check's default ``max_sync_age``: an hour in i, d or f with nothing at work on the table.
DEFAULT_MAX_SYNC_AGE = dt.timedelta(hours=1)


@dataclass(frozen=True)
class Lag:
    """How far behind a subscription is, measured now (the XCom of the check)."""

    subscription: str
    measured_at: str
    retained_wal_bytes: int | None  # WAL the slot holds back on the publisher (pg_current_wal_lsn - restart_lsn)
    wal_status: str | None
    last_batch_at: str | None  # when the newest applied batch committed
    batch_age_seconds: float | None  # now - last_batch_at
    last_batch_lag_seconds: float | None  # the commit-time lag that batch had when it ran
    last_error: str | None
    problems: tuple[str, ...] = ()
    #: The tables in i, d or f for longer than ``max_sync_age`` (and no copy or reconcile of them running now).
    stuck_tables: tuple[str, ...] = ()
    #: ``paused`` (the incremental sync's DAG paused, or the subscription disabled) or ``at risk`` (the slot near an
    #: invalidation: ``exposures``), with the reason; None: neither
    state: str | None = None
    reason: str | None = None
    #: the publisher's limits counting down on the slot (core/slot_retention.py ``Exposure.as_dict``)
    exposures: tuple[dict, ...] = ()
    enabled: bool = True
    #: the incremental sync as Airflow sees it (operators/apply_dag.py), when ``apply_dag_id`` was given
    apply_dag: dict | None = None
    #: what the apply's schedule risks against the publisher's slot limits (core/slot_retention.py ``schedule_risks``)
    warnings: tuple[str, ...] = ()
    #: how long the apply running now has held the subscription's apply lock (seconds), None: none runs
    apply_running_seconds: float | None = None
    #: the standby panel: each standby's readiness, role (standby, promoted: the publisher now), timeline
    standbys: tuple[dict, ...] = ()


class SubscriptionLagCheckOperator(BaseOperator):
    """Measure how far a subscription is behind and fail (no retry) when it is past a threshold.

    Two measures, both read now: the WAL the subscription's slot holds back on the publisher
    (``pg_replication_slots``; the publisher's disk fills with it), and the time since the newest
    batch the subscriber applied (``rowfilter.batch_history``). A slot that is gone or lost fails the
    check too. Each measure is also sent as a gauge through Airflow's metrics
    (``rowfilter.<subscription>.retained_wal_bytes``, ``….batch_age_seconds``), so a StatsD or
    OpenTelemetry backend can chart and alert on them. Run it on a schedule of its own (the DAG factory's watch
    DAG does, after its slot guard), so that a paused, stuck or failing apply does not hold it up, and let the
    task's failure alert (``email``, ``on_failure_callback``).

    :param subscription: the subscription's name. (templated)
    :param subscriber_conn_id: the subscriber's Airflow ``postgres`` connection. (templated)
    :param publisher_conn_id: the publisher's; without it the retained WAL is not measured. (templated)
    :param max_retained_wal: a size (``'1GB'``, ``'512MB'``, or bytes); None: not checked. (templated)
    :param max_batch_age: the longest time since the last applied batch (``timedelta`` or seconds);
        None: not checked.
    :param max_sync_age: the longest time a table may stay in ``i``, ``d`` or ``f`` (``timedelta`` or seconds;
        default 1 h; None: not checked): past it the check fails naming each such table, its state and what moves
        it on, unless a copy or reconcile of it holds its lock now (a long copy at work is not stuck).
    :param standby_conn_ids: the publisher's physical standbys (Airflow ``postgres`` connections): the check
        fails when one is not ready to take over the slot (publisher/failover.py, PostgreSQL's "Logical
        Replication Failover" procedure), naming what is wrong and the fix; one promoted since, which the
        publisher's connection reaches now, is the publisher and counts as ready. (templated)
    :param apply_dag_id: the incremental-sync DAG: the check says whether it is paused (through the task's
        Execution API), and a failure while it is says so. (templated)
    :param apply_schedule: the apply's schedule: the check logs what it risks against the publisher's slot limits.
    :param skip_unsubscribed: skip, saying why, a subscription not subscribed yet or dropped.

    With ``publisher_conn_id`` it also fails, before it happens, when the slot has been idle for half of the
    publisher's ``idle_replication_slot_timeout`` (``inactive_since``, PostgreSQL 17+) or holds more WAL than
    ``max_slot_wal_keep_size`` allows; an invalidated slot fails it with the cause PostgreSQL records
    (``invalidation_reason``). A failed check keeps what it found as the XCom ``check`` of its task.

    Returns (XCom) the measures: ``{"subscription": "s1", "retained_wal_bytes": 16777216, "wal_status":
    "reserved", "batch_age_seconds": 42.0, "last_batch_lag_seconds": 0.8, "problems": [], …}``.
    """

    template_fields: Sequence[str] = ("subscription", "subscriber_conn_id", "publisher_conn_id", "max_retained_wal",
                                      "standby_conn_ids", "apply_dag_id")
    ui_color = "#f6e0c0"

    def __init__(self, *, subscription: str, subscriber_conn_id: str, publisher_conn_id: str | None = None,
                 max_retained_wal: str | int | None = "1GB", max_batch_age: dt.timedelta | float | None = None,
                 standby_conn_ids: Sequence[str] | None = None,
                 max_sync_age: dt.timedelta | float | None = DEFAULT_MAX_SYNC_AGE, apply_dag_id: str | None = None,
                 apply_schedule: str | int | None = None, skip_unsubscribed: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.apply_dag_id = apply_dag_id
        self.apply_schedule = apply_schedule
        self.skip_unsubscribed = skip_unsubscribed
        self.max_sync_age = max_sync_age
        self.standby_conn_ids = standby_conn_ids
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.publisher_conn_id = publisher_conn_id
        self.max_retained_wal = max_retained_wal
        self.max_batch_age = max_batch_age

    @clear_errors
    def execute(self, context: Context) -> dict[str, Any]:
        try:
            limit = None if self.max_retained_wal in (None, "") else parse_size(
                self.max_retained_wal, f"{self.task_id}: max_retained_wal")
            if self.skip_unsubscribed:
                _skip_unless_subscribed(self.subscription, self.subscriber_conn_id)
            lag = measure(self.subscription, self.subscriber_conn_id, self.publisher_conn_id, limit,
                          _seconds(self.max_batch_age), tuple(self.standby_conn_ids or ()),
                          _seconds(self.max_sync_age, "max_sync_age"), apply_dag=apply_dag(context, self.apply_dag_id),
                          apply_schedule=self.apply_schedule)
        except (RowFilterError, psycopg.Error) as e:
            self._keep({"problems": [f"cannot measure the lag: {str(e).strip().splitlines()[0]}"]}, context)
            raise AirflowFailException(f"{self.task_id}: cannot measure the lag of {self.subscription!r}: "
                                       f"{str(e).strip()}") from e
        lag_metrics(lag.subscription, lag.retained_wal_bytes, lag.batch_age_seconds)
        self.log.info("Subscription %s: %s", lag.subscription, describe(lag))
        for text in lag.warnings:  # the schedule against the slot's limits, as validate and status say it
            self.log.warning("%s", text)
        if lag.problems:
            self._keep(plain(asdict(lag)), context)
            raise AirflowFailException(f"subscription {lag.subscription!r} is behind: " + "; ".join(lag.problems))
        return plain(asdict(lag))

    def _keep(self, measured: dict[str, Any], context: Context) -> None:
        """What a failed check found, as the XCom ``check`` of its task: the Replication page shows it as the
        reason of the failure (a failed task has no return value)."""
        ti = context.get("ti") if context else None
        if ti is None or not hasattr(ti, "xcom_push"):
            return
        try:
            ti.xcom_push(key="check", value=measured)
        except Exception as e:  # the failure itself is what alerts; its reason is also in the log
            self.log.warning("could not keep the check's result for the Replication page: %s", e)


def measure(subscription: str, subscriber_conn_id: str, publisher_conn_id: str | None,
            max_retained_wal: int | None, max_batch_age: float | None, standby_conn_ids: Sequence[str] = (),
            max_sync_age: float | None = None, *, apply_dag: ApplyDag | None = None,
            apply_schedule: str | int | None = None) -> Lag:
    """The subscription's lag now, and what is past the thresholds (``problems``)."""
    with RowFilterHook.endpoint(subscriber_conn_id, "subscriber").connect() as conn:
        reader = StateReader(conn, subscription)
        row = reader.require_subscription()
        batch = reader.last_batch()
        rels = reader.tables()
        copied = [(str(t.table), t.lsn) for t in rels if t.state.value == "f" and t.lsn]
        now = one(conn.execute("SELECT clock_timestamp()"))[0]
        stuck = [] if max_sync_age is None else _stuck(conn, subscription, rels, now, max_sync_age)
        running = apply_running_for(conn, subscription)
    problems: list[str] = [_stuck_problem(stuck, now, max_sync_age)] if stuck and max_sync_age else []
    retained = status = None
    ready: list = []
    counting: list[dict] = []
    warnings: list[str] = []
    at_risk: str | None = None
    if publisher_conn_id:
        standbys = [RowFilterHook.endpoint(c, "standby") for c in standby_conn_ids]
        with RowFilterHook.endpoint(publisher_conn_id, "publisher").connect() as conn:
            _, slot = read_slot(conn, row.slot_name)
            retention = read_retention(conn)
            published_now = one(conn.execute("SELECT clock_timestamp()"))[0]
            ready = readiness(conn, row.slot_name, [(e.conn_id or e.url, e.connect) for e in standbys], copied)
        if not slot.exists:
            problems.append(f'its replication slot "{row.slot_name}" does not exist on the publisher '
                            "(see `rowfilter refresh --recreate-slot`)")
        elif slot.lost:
            cause, fix = invalidation(slot.invalidated or "wal_removed", retention, slot.inactive_since)
            problems.append(f'its replication slot "{row.slot_name}" was invalidated ({slot.invalidated}): {cause}. '
                            f"To keep it from happening again: {fix}; {WAY_BACK}")
        else:
            alert = idle_alert(retention, None if slot.active else slot.inactive_since, published_now)
            if alert:
                problems.append(alert)
            found = exposures(retention, active=slot.active, inactive_since=slot.inactive_since,
                              wal_status=slot.wal_status, safe_wal_size=slot.safe_wal_size, now=published_now)
            counting = [e.as_dict() for e in found]
            at_risk = next((f"its slot would be {e.describe()}" for e in found if e.at_risk), None)
            if slot.wal_status == "unreserved":
                problems.append(f'its replication slot "{row.slot_name}" holds more WAL than max_slot_wal_keep_size '
                                "allows (wal_status unreserved): the publisher's next checkpoint invalidates it; run "
                                f"the apply now. {KEEP_FIX[0].upper()}{KEEP_FIX[1:]}")
        if apply_schedule is not None:
            warnings = schedule_risks(retention, longest_gap(apply_schedule), apply_schedule)
        problems += [f"standby {r.standby} is not ready to take over its slot: " + "; ".join(r.problems)
                     for r in ready if not r.ready and not r.is_publisher]
        retained, status = slot.retained_bytes, slot.wal_status
        if max_retained_wal is not None and retained is not None and retained > max_retained_wal:
            problems.append(f'its slot "{row.slot_name}" holds back {size(retained)} of WAL on the publisher, '
                            f"more than max_retained_wal ({size(max_retained_wal)})")
    age = None if batch is None else max((now - batch.finished_at).total_seconds(), 0.0)
    paused = paused_reason(row.enabled, apply_dag)
    # A subscription disabled on purpose (ALTER SUBSCRIPTION … DISABLE) is not late; a paused DAG may be an
    # accident, and is said with the lateness it causes.
    if max_batch_age is not None and row.enabled:
        why = f" ({paused})" if paused else ""
        if batch is None:
            problems.append(f"no batch has been applied yet{why}")
        elif age is not None and age > max_batch_age:
            problems.append(f"its last batch was applied {duration(age)} ago (at {stamp(batch.finished_at)}), "
                            f"more than max_batch_age ({duration(max_batch_age)}){why}")
    state, reason = ("at risk", at_risk) if at_risk else ("paused", paused) if paused else (None, None)
    return Lag(subscription, now.isoformat(), retained, status,
               None if batch is None else batch.finished_at.isoformat(), None if age is None else round(age, 3),
               None if batch is None else batch.lag_seconds, row.last_error, tuple(problems),
               tuple(f"{r.table} ({r.state.value})" for r in stuck), state, reason, tuple(counting), row.enabled,
               None if apply_dag is None else apply_dag.as_dict(), tuple(warnings), running,
               tuple({**r.as_dict(), "summary": r.summary()} for r in ready))


def plain(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as JSON has it (lists, not tuples): an XCom Airflow stores as it is, which the page reads back."""
    return json.loads(json.dumps(value, default=str))


def paused_reason(enabled: bool, dag: ApplyDag | None) -> str | None:
    """Why nothing applies the subscription now, or None."""
    if not enabled:
        return "the subscription is disabled (`rowfilter disable`): nothing is applied until `rowfilter enable`"
    if dag is not None and dag.paused:
        return f"its incremental sync {dag.dag_id} is paused: nothing is applied until it is unpaused"
    return None


def _skip_unless_subscribed(subscription: str, subscriber_conn_id: str) -> None:
    """Skip (saying why) a check of a subscription with no state: not subscribed yet, or dropped."""
    with RowFilterHook.endpoint(subscriber_conn_id, "subscriber").connect() as conn:
        reader = StateReader(conn, subscription)
        row = reader.subscription_row()
        drop = reader.last_drop() if row is None else None
    if row is None:
        raise AirflowSkipException(
            f"subscription {subscription!r} " + (f"was dropped at {drop.dropped_at:%Y-%m-%d %H:%M:%S %Z}" if drop
                                                 else "is not subscribed yet") + ": nothing to check")

#: What moves a table on from each state it can be stuck in.
_MOVES_ON = {"i": "the snapshot copies it (`rowfilter snapshot`, the initial-sync or refresh DAG)",
             "d": "its copy (or reconcile) did not finish: `rowfilter snapshot` copies it again (`rowfilter reconcile` "
                  "for one a reconcile holds)",
             "f": "the apply catches it up (`rowfilter apply`, the incremental-sync DAG): is it paused or failing?"}
# A copy or a reconcile holds the table's job lock (subscriber/state.py job_lock_key: pg_advisory_lock(hashtext(
# 'rowfilter:<subscription>'), hashtext('<table>'))) for as long as it runs: pg_locks shows it as two int4 keys.
_WORKING = ("""SELECT t FROM unnest(%s::text[]) AS t WHERE EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory'
                   AND granted AND classid = hashtext(%s)::oid AND objid = hashtext(t)::oid AND objsubid = 2)""")


def _stuck(conn: psycopg.Connection, subscription: str, rels: list[RelState], now: dt.datetime,
           limit: float) -> list[RelState]:
    """The tables in i, d or f for longer than ``limit`` seconds that no copy or reconcile works on now."""
    old = [r for r in rels if r.state.value in _MOVES_ON and r.state_since is not None
           and (now - r.state_since).total_seconds() > limit]
    if not old:
        return []
    key = job_lock_key(subscription, "")[0]
    working = {t for (t,) in conn.execute(_WORKING, ([str(r.table) for r in old], key)).fetchall()}
    return [r for r in old if str(r.table) not in working]


def _stuck_problem(stuck: list[RelState], now: dt.datetime, limit: float) -> str:
    each = []
    for r in stuck:
        error = f"; its last error: {r.last_error.splitlines()[0]}" if r.last_error else ""
        since = r.state_since or now
        each.append(f"{r.table} in state {r.state.value} ({r.state.label}) for {duration((now - since).total_seconds())} "
                    f"(since {stamp(since)}): {_MOVES_ON[r.state.value]}{error}")
    return (f"{len(stuck)} table(s) not replicating for more than max_sync_age ({duration(limit)}): "
            + "; ".join(each))


def gauges_now(resolved: ResolvedSpec) -> None:
    """Send the retained WAL and batch-age gauges of ``resolved``'s subscription, measured now (after an
    ApplyChanges run, failed or not); best effort: what cannot be read is not sent, and nothing raises."""
    name = resolved.spec.subscription
    try:
        with resolved.connect("subscriber") as conn:
            reader = StateReader(conn, name)
            row, batch = reader.subscription_row(), reader.last_batch()
            now = one(conn.execute("SELECT clock_timestamp()"))[0]
        age = None if batch is None else max((now - batch.finished_at).total_seconds(), 0.0)
        retained = None
        if row is not None and resolved.spec.publisher:
            with resolved.connect("publisher") as conn:
                retained = read_slot(conn, row.slot_name)[1].retained_bytes
    except (RowFilterError, psycopg.Error):
        return
    lag_metrics(name, retained, age)


def schedule_warnings(resolved: ResolvedSpec) -> list[str]:
    """What the spec's ``apply_schedule`` risks against the publisher's slot limits now (core/slot_retention.py
    ``schedule_risks``, what validate and status print), for the apply's task log; best effort: [] when the
    publisher cannot be read or no schedule is known."""
    spec = resolved.spec
    if spec.apply_schedule is None or not spec.publisher:
        return []
    try:
        endpoint = resolved.endpoints.get("publisher")
        with (endpoint.connect(connect_timeout=5) if endpoint is not None
              else open_session(spec.publisher, connect_timeout=5)) as conn:
            retention = read_retention(conn)
        return schedule_risks(retention, longest_gap(spec.apply_schedule), spec.apply_schedule)
    except (RowFilterError, psycopg.Error):
        return []


def describe(lag: Lag) -> str:
    parts = [f"{lag.state}: {lag.reason}"] if lag.state else []
    if lag.retained_wal_bytes is not None:
        parts.append(f"slot retains {size(lag.retained_wal_bytes)} of WAL ({lag.wal_status or 'no wal_status'}) now")
    if lag.batch_age_seconds is None:
        parts.append("no batch applied yet")
    else:
        then = "" if lag.last_batch_lag_seconds is None else f", {lag.last_batch_lag_seconds:.1f} s behind then"
        parts.append(f"last batch applied {duration(lag.batch_age_seconds)} ago{then}")
    if lag.last_error:
        parts.append(f"last error: {lag.last_error.splitlines()[0]}")
    parts += [f"standby {r['standby']}: {r['summary']}" for r in lag.standbys]
    if lag.apply_running_seconds is not None:
        parts.append(f"an apply runs now (for {duration(lag.apply_running_seconds)})")
    if lag.apply_dag and lag.apply_dag["running_runs"] and lag.apply_running_seconds is None:
        parts.append(f"{lag.apply_dag['dag_id']} has a run in state running, but no apply holds the subscription's "
                     "lock in the subscriber: its worker may be gone (Airflow notices after its heartbeat timeout)")
    return "; ".join(parts)


def _seconds(value: dt.timedelta | float | None, what: str = "max_batch_age") -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise AirflowFailException(f"{what}={value!r} is not a positive number of seconds or a timedelta")
    return float(value)
