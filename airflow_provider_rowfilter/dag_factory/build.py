"""The DAGs of one spec file, and of every spec file in a folder (a file that fails becomes placeholders)."""

from __future__ import annotations

import datetime as dt
import logging
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.dag_kinds import DAG_KINDS
from airflow_provider_rowfilter.core.spec.schedule import LATE_INTERVALS, longest_gap
from airflow_provider_rowfilter.core.spec.values import CONN_ID
from airflow_provider_rowfilter.dag_factory.copies import copy_tasks
from airflow_provider_rowfilter.dag_factory.operations import operations_dags
from airflow_provider_rowfilter.dag_factory.placeholders import (
    SpecFileWarning,
    invalid_spec_dag,
    lenient_settings,
    placeholder_ids,
)
from airflow_provider_rowfilter.dag_factory.settings import (
    SPEC_PATTERNS,
    AirflowSettings,
    SubscriptionFile,
    callback_from,
    email_notifier,
)
from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator
from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator
from airflow_provider_rowfilter.operators.slot_guard import SlotGuardOperator
from airflow_provider_rowfilter.operators.subscription_lag import SubscriptionLagCheckOperator
from airflow_provider_rowfilter.sensors.subscription_rel import SubscriptionRelSensor

log = logging.getLogger(__name__)


def build_dags(path: str | Path) -> dict[str, DAG]:
    """The three DAGs of one spec file, by DAG id."""
    source = SubscriptionFile.load(path)
    spec, s = source.spec, source.settings
    ids = source.dag_ids
    # Keyword arguments shared by several operators: typed as Any (each operator checks its own at runtime).
    job: dict[str, Any] = {"spec": str(source.path), "conn_id": s.spark_conn_id, "conf": dict(s.conf)}
    who: dict[str, Any] = {"subscription": spec.subscription, "subscriber_conn_id": spec.subscriber_conn_id}
    alias = s.asset_alias or f"rowfilter_{spec.subscription}"
    default_args: dict[str, Any] = {
        "retries": s.retries,
        "retry_delay": dt.timedelta(seconds=s.retry_delay),
        "retry_exponential_backoff": s.retry_exponential_backoff,
        "max_retry_delay": dt.timedelta(seconds=s.max_retry_delay),
    }
    if s.owner:
        default_args["owner"] = s.owner
    callbacks = [email_notifier(s.email, str(source.path))] if s.email else []
    if s.on_failure_callback:
        callbacks.append(callback_from(s.on_failure_callback, str(source.path)))
    if callbacks:
        default_args["on_failure_callback"] = callbacks
    bounded: dict[str, Any] = {
        "execution_timeout": None if s.execution_timeout is None else dt.timedelta(seconds=s.execution_timeout)}
    copy_bound = None if s.copy_execution_timeout is None else dt.timedelta(seconds=s.copy_execution_timeout)
    common: dict[str, Any] = {
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
        ApplyChangesOperator(task_id="apply", max_changes=s.max_changes, time_budget=s.time_budget,
                             asset_alias=alias, **bounded, **job)
    dags[dag.dag_id] = dag

    with DAG(dag_id=ids["refresh"], schedule=s.refresh_schedule,
             description=f"Refresh publication of {spec.subscription}, then copy the tables it added; with "
             "recreate_slot and reconcile, the repair of a lost slot in place",
             params={"recreate_slot": Param(False, type="boolean", title="Recreate the slot",
                                            description="the slot was dropped or invalidated: create a new one (its "
                                            "tables emptied for a new copy, unless reconcile)"),
                     "reconcile": Param(False, type="boolean", title="Reconcile in place",
                                        description="repair the tables in place instead of emptying them: the lost "
                                        "slot's, and those whose copy filter or column list changed (off: the "
                                        "spec's reconcile)")},
             render_template_as_native_obj=True, **(scheduled if s.refresh_schedule else common)) as dag:
        refresh = RefreshPublicationOperator(task_id="refresh", recreate_slot="{{ params.recreate_slot }}",
                                             reconcile="{{ params.reconcile }}", **bounded, **job)
        listed, _ = copy_tasks(pool=s.pool, tables=None, execution_timeout=copy_bound, **who, **job)
        refresh >> listed
    dags[dag.dag_id] = dag
    watch = watch_dag(source, job, who, common)
    dags[watch.dag_id] = watch
    dags.update(operations_dags(source, job, common))
    return dags


def watch_dag(source: SubscriptionFile, job: dict[str, Any], who: dict[str, Any], common: dict[str, Any]) -> DAG:
    """``<prefix>_watch``, on ``airflow.watch_schedule`` (every 5 minutes), never paused at creation: the slot guard
    (a capture into the change log while the incremental sync is paused or the subscription disabled, or the slot
    near an invalidation), then the lag check. Apart from the incremental sync, so that a paused, stuck or failing
    apply still alerts and a killed worker's run (``running`` until Airflow's heartbeat timeout) holds up neither."""
    spec, s, ids = source.spec, source.settings, source.dag_ids
    schedule = spec.apply_schedule if spec.apply_schedule is not None else s.schedule  # what the apply runs on
    gap = longest_gap(schedule) if schedule is not None else None
    late = s.max_batch_age if s.max_batch_age is not None else (LATE_INTERVALS * gap if gap else None)
    standbys = [c for c in spec.standbys if CONN_ID.match(c)]  # the check reads them through Airflow
    synced: dict[str, Any] = {} if s.max_sync_age is None else {"max_sync_age": s.max_sync_age}
    once: dict[str, Any] = {"retries": 0}
    with DAG(dag_id=ids["watch"], schedule=source.watch_schedule,
             description=f"Watch {spec.subscription}: keep its slot read while the apply is paused or disabled, and "
             "check its lag and slot on a schedule of their own", **{**common, "is_paused_upon_creation": False}) as dag:
        guard = SlotGuardOperator(task_id="guard_slot", spec=job["spec"], apply_dag_id=ids["incremental_sync"],
                                  time_budget=s.guard_time_budget,
                                  execution_timeout=dt.timedelta(seconds=s.guard_time_budget + 180), **once)
        guard >> SubscriptionLagCheckOperator(
            task_id="check_lag", publisher_conn_id=spec.publisher_conn_id,
            max_retained_wal=s.max_retained_wal if s.max_retained_wal is not None else spec.retained_wal_warning_bytes,
            max_batch_age=late, standby_conn_ids=standbys, apply_dag_id=ids["incremental_sync"],
            apply_schedule=schedule, skip_unsubscribed=True, trigger_rule="all_done",
            execution_timeout=dt.timedelta(minutes=5), **once, **synced, **who)
    return dag


def dags_from_folder(folder: str | Path, patterns: Iterable[str] = SPEC_PATTERNS) -> dict[str, DAG]:
    """The DAGs of every spec file in ``folder`` (not recursive), by DAG id.

    Each file stands alone: one that is not a valid spec (or repeats another file's subscription or
    DAG ids) does not stop the others. It becomes a placeholder DAG (dag_factory/placeholders.py) whose
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
            dags.update(_placeholders(path, error, set(dags)))
            continue
        seen[name] = path
        dags.update(built)
    return dags


def _placeholders(path: Path, error: Exception, taken: set[str]) -> dict[str, DAG]:
    """The placeholder DAGs of an invalid file, under its own ids and with its schedule where they can be read; when
    even that fails (whatever the file holds), one placeholder on the factory's default schedule, so that the file's
    failure still shows and alerts and the folder's other files load."""
    try:
        kept = lenient_settings(path, AirflowSettings.from_mapping, email_notifier)
        return {dag_id: invalid_spec_dag(dag_id, path, error, kind=kind, settings=kept)
                for dag_id, kind in placeholder_ids(path, taken, DAG_KINDS).items()}
    except Exception as e:
        log.error("%s: its placeholder falls back to the defaults: %s: %s", path, type(e).__name__, e)
        dag_id = f"rowfilter_invalid_{re.sub(r'[^A-Za-z0-9_.-]', '_', path.name)}"
        return {dag_id: invalid_spec_dag(dag_id, path, error)}
