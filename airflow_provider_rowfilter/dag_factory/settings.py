"""A spec file as the DAG factory reads it: the validated spec and its ``airflow:`` settings.

:class:`AirflowSettings` is the file's optional ``airflow:`` mapping (what the ``rowfilter`` command and the
jobs ignore), each key checked with a message naming the file and the key; :class:`SubscriptionFile` is
one file loaded: its spec, its settings, its DAG ids.
"""

from __future__ import annotations

import datetime as dt
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from airflow.sdk import DAG

from airflow_provider_rowfilter.core.errors import RowFilterError, SpecError
from airflow_provider_rowfilter.core.input_files import MAX_SPEC_BYTES, read_text, yaml_document
from airflow_provider_rowfilter.core.schedule import DURATION, parse_duration
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.spec_values import parse_size
from airflow_provider_rowfilter.hooks.subscription_rel import parse_tables

#: The pool that bounds parallel initial copies unless a spec file names another.
DEFAULT_POOL = "rowfilter_copies"
SPEC_PATTERNS = ("*.yaml", "*.yml")
#: The DAGs of one spec file: the three that replicate, then the operations, run by hand with parameters.
DAG_KINDS = ("initial_sync", "incremental_sync", "refresh", "skip_transaction", "resync_tables", "drop_subscription",
             "sync_sequences", "verify", "reconcile_tables", "watch", "disable_subscription", "enable_subscription")
_DAG_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class AirflowSettings:
    """The ``airflow:`` section of a spec file: how the factory builds the subscription's DAGs."""

    #: Beginning of the three DAG ids; default ``rowfilter_<subscription>``.
    dag_id_prefix: str | None = None
    #: The Airflow ``spark`` connection the jobs are submitted with.
    spark_conn_id: str = "spark_default"
    #: spark-submit settings (``SparkSubmitOperator.conf``); the job's own session settings are the
    #: spec's ``spark_conf``.
    conf: dict[str, str] = field(default_factory=dict)
    #: Schedule of the incremental sync (cron, preset or None for manual runs only).
    schedule: str | None = "*/5 * * * *"
    #: Schedule of the refresh DAG; None (default): run it after changing the publications.
    refresh_schedule: str | None = None
    #: Whether the scheduled DAGs (the incremental sync, a scheduled refresh) are paused when Airflow first
    #: sees them. Default no: an incremental run before the initial sync is skipped, saying so
    #: (operators/subscription_guard.py). The manual DAGs (initial sync, operations) are never paused at
    #: creation: a skip or a drop must run when triggered in the middle of an incident.
    paused_upon_creation: bool = False
    start_date: dt.datetime = dt.datetime(2025, 1, 1)
    #: Most changes one incremental run captures (``--max-changes``); None for the job's default.
    max_changes: int | None = None
    #: Seconds after which an incremental run starts no further batch (it drains otherwise); fits the
    #: default schedule. None: no budget.
    time_budget: float | None = 240.0
    #: Pool of the snapshot tasks: its slots bound how many tables are copied at once.
    pool: str = DEFAULT_POOL
    #: The tables the initial sync copies and waits for; None for all of the subscription's.
    tables: tuple[str, ...] | None = None
    retries: int = 3
    retry_delay: float = 30.0  # seconds
    retry_exponential_backoff: float = 2.0
    max_retry_delay: float = 1800.0  # seconds
    #: The initial sync's wait for ``r``: seconds between reads, give-up time, deferrable.
    poke_interval: float = 60.0
    sensor_timeout: float = 6 * 3600.0
    deferrable: bool = False
    #: A ``check_lag`` task after the incremental sync's apply fails (and alerts) when the slot holds back
    #: more WAL than this (a size: ``'1GB'``) or the last batch is older than ``max_batch_age`` seconds;
    #: neither set (default): no check task.
    max_retained_wal: str | int | None = None
    max_batch_age: float | None = None
    #: The same check fails for a table in ``i``, ``d`` or ``f`` for longer than this many seconds with no copy or
    #: reconcile of it running; None: the operator's default (1 h). Setting it alone adds the check task too.
    max_sync_age: float | None = None
    #: Name of the ApplyChanges operator's AssetAlias outlet; default ``rowfilter_<subscription>``.
    asset_alias: str | None = None
    tags: tuple[str, ...] = ()
    #: The tasks' owner (Airflow's default ``airflow`` when None), and who is emailed when a task fails (by
    #: the smtp provider's ``SmtpNotifier``, through the ``smtp_default`` connection).
    owner: str | None = None
    email: tuple[str, ...] | None = None
    #: ``package.module.function`` called with the context when a task fails (imported at parse time).
    on_failure_callback: str | None = None
    #: Schedule of the watch DAG (the slot guard and the lag check, on a schedule of their own: a paused, stuck or
    #: failing apply still alerts, and a paused or disabled one keeps its slot read): a cron, a preset or a
    #: duration ('30s', '2min'); None: run it by hand.
    watch_schedule: str | None = "*/5 * * * *"
    #: Seconds the slot guard of one watch run may capture for.
    guard_time_budget: float = 120.0
    #: Schedule of the verify DAG (every table compared with its publisher's rows); None (default): run it by hand.
    verify_schedule: str | None = None
    #: Seconds an apply or refresh task may run before Airflow stops it (and retries it): a hung apply
    #: would otherwise hold the incremental sync's only run slot for ever. None: no limit.
    execution_timeout: float | None = 3600.0
    #: The same for each snapshot copy; None (default): a copy runs as long as its table needs.
    copy_execution_timeout: float | None = None

    @classmethod
    def from_mapping(cls, data: Any, source: str) -> AirflowSettings:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise SpecError(f"{source}: airflow: must be a mapping of settings, not {data!r}",
                            hint="airflow:\n  schedule: '*/5 * * * *'\n  pool: rowfilter_copies")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"{source}: unknown key {unknown[0]!r} in airflow:",
                            hint=f"known keys: {', '.join(sorted(known))}")
        values = dict(data)
        for key, kind in _KINDS.items():
            if key in values and values[key] is not None:
                values[key] = _check(source, key, values[key], kind)
        for key in ("tables", "tags", "email"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        for address in values.get("email") or ():
            if "@" not in address:
                raise SpecError(f"{source}: airflow: email={address!r} is not an email address",
                                hint="email: [team@example.com] (Airflow's SMTP settings send it)")
        if values.get("on_failure_callback") is not None:
            callback_from(values["on_failure_callback"], source)
        settings = cls(**values)
        if settings.dag_id_prefix is not None and not _DAG_ID.match(settings.dag_id_prefix):
            raise SpecError(f"{source}: airflow: dag_id_prefix={settings.dag_id_prefix!r} is not a DAG id",
                            hint="use letters, digits, '_', '-' and '.'")
        if settings.tables is not None:
            try:
                parse_tables(list(settings.tables))
            except RowFilterError as e:
                raise SpecError(f"{source}: airflow: {e}") from e
        return settings


_KINDS: dict[str, Any] = {
    "dag_id_prefix": str, "spark_conn_id": str, "conf": dict, "schedule": "schedule", "refresh_schedule": "schedule",
    "paused_upon_creation": bool,
    "start_date": "date", "max_changes": "positive", "time_budget": "seconds", "pool": str, "tables": "names", "retries": "count",
    "retry_delay": "seconds", "retry_exponential_backoff": "seconds", "max_retry_delay": "seconds",
    "poke_interval": "seconds", "sensor_timeout": "seconds", "deferrable": bool, "asset_alias": str,
    "max_retained_wal": "size", "max_batch_age": "seconds", "max_sync_age": "seconds",
    "tags": "names", "owner": str, "email": "names", "on_failure_callback": str, "execution_timeout": "timeout",
    "copy_execution_timeout": "timeout", "verify_schedule": str, "watch_schedule": "schedule_or_duration",
    "guard_time_budget": "seconds",
}


def _email_notifier(email: Sequence[str], source: str) -> Callable[..., Any]:
    """Airflow 3's way of emailing a failure (a task's ``email`` is deprecated): the smtp provider's notifier."""
    try:
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier
    except ImportError:
        raise SpecError(f"{source}: airflow: email needs the smtp provider, which is not installed",
                        hint="pip install apache-airflow-providers-smtp, and define the smtp_default connection") from None
    return SmtpNotifier(to=list(email))


def callback_from(path: str, source: str) -> Callable[..., Any]:
    """The function ``package.module.function`` (or ``package.module:function``) names; refused naming the key."""
    module_name, _, name = path.replace(":", ".").rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name) if module_name else None
    except (ImportError, AttributeError) as e:
        raise SpecError(f"{source}: airflow: on_failure_callback={path!r} cannot be imported: {e}",
                        hint="name a function importable where the DAGs are parsed and run, "
                        "e.g. on_failure_callback: my_alerts.page_on_call") from None
    if not callable(found):
        raise SpecError(f"{source}: airflow: on_failure_callback={path!r} is not a function",
                        hint="e.g. on_failure_callback: my_alerts.page_on_call")
    return found


def _check(source: str, key: str, value: Any, kind: Any) -> Any:
    def bad(expected: str) -> SpecError:
        return SpecError(f"{source}: airflow: {key}={value!r} is not {expected}")

    if kind is str:
        if not isinstance(value, str) or not value.strip():
            raise bad("a non-empty string")
    elif kind is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
    elif kind is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise bad("a mapping of settings")
        # Spark settings are strings; YAML's true/false must become Spark's "true"/"false", not "True".
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    elif kind == "date":
        if isinstance(value, dt.datetime):
            return value
        if isinstance(value, dt.date):
            return dt.datetime(value.year, value.month, value.day)
        try:
            return dt.datetime.fromisoformat(str(value))
        except ValueError as e:
            raise bad("a date (2025-01-01)") from e
    elif kind in ("positive", "count"):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if kind == "positive" else 0):
            raise bad("a positive integer" if kind == "positive" else "an integer >= 0")
    elif kind == "seconds":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise bad("a number of seconds >= 0")
        return float(value)
    elif kind == "size":
        try:
            parse_size(value, f"{source}: airflow: {key}")
        except SpecError:
            raise bad("a size such as '1GB' or a number of bytes") from None
    elif kind == "timeout":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise bad("a number of seconds > 0 (null: no limit)")
        return float(value)
    elif kind == "schedule_or_duration" and isinstance(value, (str, int, float)) and not isinstance(value, bool) \
            and DURATION.match(str(value)):
        return str(value)  # a duration: a timedelta schedule (watch_schedule)
    elif kind in ("schedule", "schedule_or_duration"):
        # What DagBag checks when it bags a DAG: checked here, so that a cron Airflow cannot read fails this
        # file alone (its placeholder), instead of the loader file losing that DAG with an import error.
        if not isinstance(value, str) or not value.strip():
            raise bad("a cron expression or preset ('*/5 * * * *', '@hourly'), or null")
        try:
            DAG(dag_id="rowfilter_schedule_check", schedule=value, start_date=dt.datetime(2025, 1, 1),
                max_active_runs=1).timetable.validate()  # the factory's DAGs run one at a time (@continuous needs it)
        except Exception as e:  # Airflow's timetable errors have no common base
            raise SpecError(f"{source}: airflow: {key}={value!r} is not a schedule Airflow reads: {e}",
                            hint="a cron expression of 5 fields ('*/5 * * * *') or a preset ('@hourly'); "
                            "null: manual runs only") from None
    elif kind == "names":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, Sequence) or not all(isinstance(v, str) and v for v in value):
            raise bad("a list of names")
    return value


@dataclass(frozen=True)
class SubscriptionFile:
    """A spec file the factory builds DAGs from: the validated spec and its ``airflow:`` settings."""

    path: Path
    spec: SubscriptionSpec
    settings: AirflowSettings

    @classmethod
    def load(cls, path: str | Path) -> SubscriptionFile:
        """Read and validate one spec file (no connection is looked up: this runs at every DAG parse)."""
        path = Path(path).resolve()
        spec = SubscriptionSpec.load(path)  # the same checks as the rowfilter command's
        raw = yaml_document(read_text(path, f"spec file {str(path)!r}", MAX_SPEC_BYTES), str(path))
        settings = AirflowSettings.from_mapping(raw.get("airflow"), str(path))
        if not spec.subscriber_conn_id:
            raise SpecError(f"{path}: the DAG factory needs subscriber_conn_id",
                            hint="name the subscriber's Airflow postgres connection (subscriber_conn_id: pg_sub): "
                            "the sensor and the tasks that read the state use it")
        if not (spec.publisher_conn_id or spec.publisher):
            raise SpecError(f"{path}: subscription {spec.subscription!r} has no publisher",
                            hint="set publisher_conn_id: an Airflow postgres connection id")
        return cls(path, spec, settings)

    @property
    def prefix(self) -> str:
        return self.settings.dag_id_prefix or f"rowfilter_{self.spec.subscription}"

    @property
    def watch_schedule(self) -> str | dt.timedelta | None:
        """The watch DAG's schedule as Airflow takes it: a duration becomes a ``timedelta``."""
        value = self.settings.watch_schedule
        if value is not None and DURATION.match(value):
            return dt.timedelta(seconds=parse_duration(value, f"{self.path}: airflow: watch_schedule"))
        return value

    @property
    def dag_ids(self) -> dict[str, str]:
        return {kind: f"{self.prefix}_{kind}" for kind in DAG_KINDS}
