"""DAGs from subscription spec files: a team adds a subscription by adding a YAML file.

Each spec file (the YAML the ``rowfilter`` command reads, README "Use") becomes three DAGs:

- ``<prefix>_initial_sync`` (manual): refresh, one snapshot task per table waiting for its copy
  (dynamic task mapping, bounded by a pool), apply, then wait until every table is ``r``;
- ``<prefix>_incremental_sync`` (scheduled, one run at a time, no catch-up, retries with exponential
  back-off): one ApplyChanges micro-batch per run;
- ``<prefix>_refresh`` (manual unless scheduled): refresh, then copy the tables it added;

then the operations run by hand with parameters (skip a transaction, resync tables, drop), and
``<prefix>_verify`` (manual unless ``verify_schedule``) and ``<prefix>_reconcile_tables`` (manual).

``<prefix>`` is ``rowfilter_<subscription>``. The file's optional ``airflow:`` mapping holds the
Airflow-only settings (:class:`AirflowSettings`); the ``rowfilter`` command and the jobs ignore it.
See docs/dag-factory.md.
"""

from __future__ import annotations

import datetime as dt
import importlib
import logging
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_rowfilter.core.errors import RowFilterError, SpecError
from airflow_provider_rowfilter.core.spec import CONN_ID, SubscriptionSpec, parse_size
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.hooks.subscription_rel import SubscriptionRelHook, parse_tables
from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator
from airflow_provider_rowfilter.operators.reconcile_tables import ReconcileTablesOperator
from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator
from airflow_provider_rowfilter.operators.snapshot_copy import SnapshotCopyOperator
from airflow_provider_rowfilter.operators.subscription_lag import SubscriptionLagCheckOperator
from airflow_provider_rowfilter.operators.subscription_ops import (
    DropSubscriptionOperator,
    SkipTransactionOperator,
    SyncSequencesOperator,
)
from airflow_provider_rowfilter.operators.verify_tables import VerifyTablesOperator
from airflow_provider_rowfilter.sensors.subscription_rel import SubscriptionRelSensor
from airflow_provider_rowfilter.spec_placeholders import (
    SpecFileWarning,
    invalid_spec_dag,
    lenient_settings,
    placeholder_ids,
)

__all__ = ["DAG_KINDS", "SPEC_PATTERNS", "AirflowSettings", "SpecFileWarning", "SubscriptionFile", "build_dags",
           "dags_from_folder", "invalid_spec_dag"]

#: The pool that bounds parallel initial copies unless a spec file names another.
DEFAULT_POOL = "rowfilter_copies"
#: The states a table waits for its initial copy in (``d``: a copy that did not finish).
WAITING_FOR_COPY = (SyncState.INIT, SyncState.DATA_COPY)
SPEC_PATTERNS = ("*.yaml", "*.yml")
#: The DAGs of one spec file: the three that replicate, then the operations, run by hand with parameters.
DAG_KINDS = ("initial_sync", "incremental_sync", "refresh", "skip_transaction", "resync_tables", "drop_subscription",
             "sync_sequences", "verify", "reconcile_tables")
#: An LSN as PostgreSQL writes it, or NONE (the skip DAG's parameter).
_LSN_PARAM = r"^([0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}|NONE|none)$"
_DAG_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
log = logging.getLogger(__name__)


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
    #: Name of the ApplyChanges operator's AssetAlias outlet; default ``rowfilter_<subscription>``.
    asset_alias: str | None = None
    tags: tuple[str, ...] = ()
    #: The tasks' owner (Airflow's default ``airflow`` when None), and who is emailed when a task fails (by
    #: the smtp provider's ``SmtpNotifier``, through the ``smtp_default`` connection).
    owner: str | None = None
    email: tuple[str, ...] | None = None
    #: ``package.module.function`` called with the context when a task fails (imported at parse time).
    on_failure_callback: str | None = None
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
    "max_retained_wal": "size", "max_batch_age": "seconds",
    "tags": "names", "owner": str, "email": "names", "on_failure_callback": str, "execution_timeout": "timeout",
    "copy_execution_timeout": "timeout", "verify_schedule": str,
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
    elif kind == "schedule":
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
        raw = yaml.safe_load(path.read_text())
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
    def dag_ids(self) -> dict[str, str]:
        return {kind: f"{self.prefix}_{kind}" for kind in DAG_KINDS}


def tables_waiting_for_copy(subscription: str, subscriber_conn_id: str,
                            tables: Sequence[str] | str | None = None) -> list[str]:
    """The subscription's tables (or the chosen ones) in ``i`` or ``d``: one snapshot task each.

    Read from ``rowfilter.subscription_rel`` through the subscriber's Airflow connection; a table
    named that the subscription does not have, or a subscription without state, fails without retry.
    """
    try:
        chosen = parse_tables(tables)
        reading = SubscriptionRelHook(subscriber_conn_id, subscription).read_state()
    except RowFilterError as e:
        raise AirflowFailException(str(e)) from e
    if not reading.exists:
        raise AirflowFailException(f"subscription {subscription!r} has no state in the subscriber; "
                                   "run its refresh first")
    states = {r.table: r.state for r in reading.tables}
    unknown = [str(t) for t in chosen or () if t not in states]
    if unknown:
        raise AirflowFailException(f"table(s) {', '.join(unknown)} not part of subscription {subscription!r} "
                                   f"(its tables: {', '.join(str(t) for t in sorted(states)) or 'none'})")
    # As SQL names (quoted where needed): the snapshot task reads them back as SQL (TableName.from_sql).
    return [t.as_sql() for t in sorted(chosen or states) if states[t] in WAITING_FOR_COPY]


def copy_tasks(*, pool: str, tables: Any, subscription: str, subscriber_conn_id: str,
               **job_kwargs: Any) -> Any:
    """``tables_to_copy`` and the mapped ``snapshot`` after it (call inside a DAG); returns both.

    One snapshot task per table waiting for its copy, each taking one slot of ``pool``: the pool's
    size is how many tables are copied at once (across every DAG that uses it).
    """
    listed = task(task_id="tables_to_copy")(tables_waiting_for_copy)(
        subscription=subscription, subscriber_conn_id=subscriber_conn_id, tables=tables)
    snapshot = SnapshotCopyOperator.partial(
        task_id="snapshot", pool=pool, map_index_template="{{ task.tables }}",
        subscription=subscription, subscriber_conn_id=subscriber_conn_id, **job_kwargs,
    ).expand(tables=listed)
    return listed, snapshot


def build_dags(path: str | Path) -> dict[str, DAG]:
    """The three DAGs of one spec file, by DAG id."""
    source = SubscriptionFile.load(path)
    spec, s = source.spec, source.settings
    ids = source.dag_ids
    job = {"spec": str(source.path), "conn_id": s.spark_conn_id, "conf": dict(s.conf)}
    who = {"subscription": spec.subscription, "subscriber_conn_id": spec.subscriber_conn_id}
    alias = s.asset_alias or f"rowfilter_{spec.subscription}"
    default_args: dict[str, Any] = {
        "retries": s.retries,
        "retry_delay": dt.timedelta(seconds=s.retry_delay),
        "retry_exponential_backoff": s.retry_exponential_backoff,
        "max_retry_delay": dt.timedelta(seconds=s.max_retry_delay),
    }
    if s.owner:
        default_args["owner"] = s.owner
    callbacks = [_email_notifier(s.email, str(source.path))] if s.email else []
    if s.on_failure_callback:
        callbacks.append(callback_from(s.on_failure_callback, str(source.path)))
    if callbacks:
        default_args["on_failure_callback"] = callbacks
    bounded = {"execution_timeout": None if s.execution_timeout is None else dt.timedelta(seconds=s.execution_timeout)}
    copy_bound = None if s.copy_execution_timeout is None else dt.timedelta(seconds=s.copy_execution_timeout)
    common = {
        "start_date": s.start_date, "catchup": False, "max_active_runs": 1, "default_args": default_args,
        "is_paused_upon_creation": False,
        "tags": ["rowfilter", f"subscription:{spec.subscription}", *s.tags],
        "doc_md": f"Subscription `{spec.subscription}` (publications {', '.join(spec.publications)}), "
                  f"from `{source.path}` (airflow_provider_rowfilter.dag_factory).",
    }
    tables = list(s.tables) if s.tables else None
    dags: dict[str, DAG] = {}

    with DAG(dag_id=ids["initial_sync"], schedule=None,
             description=f"Initial sync of {spec.subscription}: refresh, copy, apply, wait for r", **common) as dag:
        refresh = RefreshPublicationOperator(task_id="refresh", **bounded, **job)
        listed, snapshot = copy_tasks(pool=s.pool, tables=tables, execution_timeout=copy_bound, **who, **job)
        apply = ApplyChangesOperator(task_id="apply", max_changes=s.max_changes, asset_alias=alias,
                                     trigger_rule="none_failed", **bounded, **job)
        ready = SubscriptionRelSensor(task_id="wait_for_ready", tables=tables, target_state="r",
                                      mode="poke" if s.deferrable else "reschedule", deferrable=s.deferrable,
                                      poke_interval=s.poke_interval, timeout=s.sensor_timeout, **who)
        refresh >> listed
        snapshot >> apply >> ready
    dags[dag.dag_id] = dag

    scheduled = {**common, "is_paused_upon_creation": s.paused_upon_creation}
    with DAG(dag_id=ids["incremental_sync"], schedule=s.schedule,
             description=f"Incremental sync of {spec.subscription}: one ApplyChanges micro-batch per run",
             **scheduled) as dag:
        apply = ApplyChangesOperator(task_id="apply", max_changes=s.max_changes, time_budget=s.time_budget,
                                     asset_alias=alias, **bounded, **job)
        standbys = [c for c in spec.standbys if CONN_ID.match(c)]  # the check reads them through Airflow
        if s.max_retained_wal is not None or s.max_batch_age is not None or standbys:
            apply >> SubscriptionLagCheckOperator(
                task_id="check_lag", publisher_conn_id=spec.publisher_conn_id, max_retained_wal=s.max_retained_wal,
                max_batch_age=s.max_batch_age, standby_conn_ids=standbys, trigger_rule="none_skipped", retries=0,
                **who)
    dags[dag.dag_id] = dag

    with DAG(dag_id=ids["refresh"], schedule=s.refresh_schedule,
             description=f"Refresh publication of {spec.subscription}, then copy the tables it added",
             **(scheduled if s.refresh_schedule else common)) as dag:
        refresh = RefreshPublicationOperator(task_id="refresh", **bounded, **job)
        listed, _ = copy_tasks(pool=s.pool, tables=None, execution_timeout=copy_bound, **who, **job)
        refresh >> listed
    dags[dag.dag_id] = dag
    dags.update(operations_dags(source, job, common))
    return dags


def operations_dags(source: SubscriptionFile, job: dict[str, Any], common: dict[str, Any]) -> dict[str, DAG]:
    """The subscription's operations as DAGs run by hand, each with its parameters (Trigger DAG's form):
    what ``rowfilter skip``, ``resync`` and ``drop`` do, through the file's Airflow connections."""
    spec, ids = source.spec, source.dag_ids
    manual = {**common, "schedule": None, "default_args": {**common["default_args"], "retries": 0}}
    dags: dict[str, DAG] = {}
    with DAG(dag_id=ids["skip_transaction"], description=f"Skip one remote transaction of {spec.subscription} "
             "(ALTER SUBSCRIPTION … SKIP): the finish LSN a conflict error names",
             params={"lsn": Param(type="string", pattern=_LSN_PARAM, title="Finish LSN of the transaction",
                                  description="as the conflict error gives it (0/1A2B3C8); NONE clears a pending skip")},
             **manual) as dag:
        SkipTransactionOperator(task_id="skip", spec=job["spec"], lsn="{{ params.lsn }}")
    dags[dag.dag_id] = dag
    with DAG(dag_id=ids["resync_tables"], description=f"Copy tables of {spec.subscription} again: empty them in the "
             "subscriber, back to i, then the initial copy (the incremental sync catches them up)",
             params={"tables": Param([], type="array", items={"type": "string"}, minItems=1, title="Tables",
                                     description="schema.table names of the subscription")},
             **manual) as dag:
        SnapshotCopyOperator(task_id="resync", resync=True, tables="{{ params.tables | join(',') }}", **job)
    dags[dag.dag_id] = dag
    with DAG(dag_id=ids["drop_subscription"], description=f"Drop subscription {spec.subscription} (DROP "
             "SUBSCRIPTION): its slot, its state and its change log; the subscriber's tables stay",
             params={"confirm": Param(type="string", title="Type the subscription's name to drop it",
                                      description=f"{spec.subscription}"),
                     "keep_slot": Param(False, type="boolean", title="Leave the publisher alone",
                                        description="its slot keeps retaining WAL until dropped")},
             render_template_as_native_obj=True, **manual) as dag:
        DropSubscriptionOperator(task_id="drop", spec=job["spec"], confirm="{{ params.confirm }}",
                                 keep_slot="{{ params.keep_slot }}")
    dags[dag.dag_id] = dag
    with DAG(dag_id=ids["sync_sequences"], description=f"Move the sequences of {spec.subscription}'s tables in the "
             "subscriber past the publisher's (before a switchover: sequences are not replicated)",
             params={"tables": Param([], type="array", items={"type": "string"}, title="Tables",
                                     description="schema.table names; none: every table of the subscription"),
                     "dry_run": Param(False, type="boolean", title="Dry run", description="say what would be set")},
             render_template_as_native_obj=True, **manual) as dag:
        SyncSequencesOperator(task_id="sync_sequences", spec=job["spec"], tables="{{ params.tables | join(',') }}",
                              dry_run="{{ params.dry_run }}")
    dags[dag.dag_id] = dag
    dags.update(check_dags(source, job, common))
    return dags


def check_dags(source: SubscriptionFile, job: dict[str, Any], common: dict[str, Any]) -> dict[str, DAG]:
    """``verify`` (by hand, or on ``airflow: verify_schedule``): every table, or the chosen ones, compared with the
    publisher's rows, failing when one differs; ``reconcile_tables`` (by hand): tables repaired in place."""
    spec, ids, settings = source.spec, source.dag_ids, source.settings
    tables = Param([], type="array", items={"type": "string"}, title="Tables",
                   description="schema.table names of the subscription; none: every table")
    dags: dict[str, DAG] = {}
    with DAG(dag_id=ids["verify"], description=f"Verify {spec.subscription}: each table against its publisher's "
             "rows under its filters, at one consistent point (read-only); fails when one differs",
             params={"tables": tables}, **{**common, "schedule": settings.verify_schedule}) as dag:
        VerifyTablesOperator(task_id="verify", tables="{{ params.tables | join(',') }}", **job)
    dags[dag.dag_id] = dag
    manual = {**common, "schedule": None, "default_args": {**common["default_args"], "retries": 0}}
    with DAG(dag_id=ids["reconcile_tables"], description=f"Reconcile tables of {spec.subscription} in place: to what "
             "a new copy would hold, never emptying them (the incremental sync catches them up)",
             params={"tables": tables, "dry_run": Param(False, type="boolean", title="Dry run",
                                                        description="change nothing: say what would change")},
             render_template_as_native_obj=True, **manual) as dag:
        ReconcileTablesOperator(task_id="reconcile", tables="{{ params.tables | join(',') }}",
                                dry_run="{{ params.dry_run }}", **job)
    dags[dag.dag_id] = dag
    return dags


def dags_from_folder(folder: str | Path, patterns: Iterable[str] = SPEC_PATTERNS) -> dict[str, DAG]:
    """The DAGs of every spec file in ``folder`` (not recursive), by DAG id.

    Each file stands alone: one that is not a valid spec (or repeats another file's subscription or
    DAG ids) does not stop the others. It becomes a placeholder DAG (spec_placeholders.py) whose
    only task fails with the error naming the file, under the file's own DAG ids when its
    ``subscription`` (and ``airflow.dag_id_prefix``) can be read, so that the subscription stays in
    the UI and a run in flight fails with the reason instead of "Dag not found"; the incremental
    sync's placeholder keeps the file's schedule and failure callbacks, so the failure recurs on the
    subscription's schedule and alerts. The error is also issued as a warning (Airflow records it
    against the loader file) and logged.
    """
    folder = Path(folder)
    files = sorted({p for pattern in patterns for p in folder.glob(pattern) if p.is_file()})
    dags: dict[str, DAG] = {}
    seen: dict[str, Path] = {}
    for path in files:
        try:
            source = SubscriptionFile.load(path)
            name = source.spec.subscription
            if name in seen:
                raise SpecError(f"subscription {name!r} is also defined in {seen[name]}",
                                hint="one spec file per subscription")
            built = build_dags(path)
            taken = sorted(set(built) & set(dags))
            if taken:
                raise SpecError(f"DAG id {taken[0]!r} is already built from another file",
                                hint="set airflow: dag_id_prefix: to tell them apart")
        except Exception as e:  # whatever breaks one file (a bad cron too) must not hide the others
            error = e if str(path.resolve()) in str(e) or str(path) in str(e) else SpecError(f"{path}: {e}")
            log.error("%s", error)
            warnings.warn(str(error), SpecFileWarning, stacklevel=2)
            kept = lenient_settings(path, AirflowSettings.from_mapping, _email_notifier)
            for dag_id, kind in placeholder_ids(path, set(dags), DAG_KINDS).items():
                dags[dag_id] = invalid_spec_dag(dag_id, path, error, kind=kind, settings=kept)
            continue
        seen[name] = path
        dags.update(built)
    return dags
