"""ApplyChangesOperator: PostgreSQL's apply worker as micro-batches, one run draining the slot, as an Airflow task."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import psycopg
from airflow.sdk import Asset, AssetAlias
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from airflow_provider_rowfilter.core.apply.plan import DEFAULT_MAX_CHANGES
from airflow_provider_rowfilter.core.errors import RowFilterError, SpecError, UnreachableError
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec
from airflow_provider_rowfilter.humane import batch_lag, counts_text, duration
from airflow_provider_rowfilter.operators.metrics import apply_metrics, failure_metrics, metrics_on
from airflow_provider_rowfilter.operators.replication_link import ReplicationPageLink, subscription_of
from airflow_provider_rowfilter.operators.rowfilter_job import RowFilterJobOperator
from airflow_provider_rowfilter.operators.subscription_guard import skip_unless_subscribed
from airflow_provider_rowfilter.operators.subscription_lag import gauges_now, schedule_warnings
from airflow_provider_rowfilter.operators.table_assets import default_asset_alias, openlineage_dataset, table_asset_uri
from airflow_provider_rowfilter.operators.task_errors import clear_errors, factory_prefix, in_airflow_terms
from airflow_provider_rowfilter.spark.settings import SHORT_BATCH_CHANGES
from airflow_provider_rowfilter.subscriber.state import StateReader

if TYPE_CHECKING:
    from airflow.sdk import Context

#: Seconds the task's own look for changes (skip_when_idle) waits for a database that does not answer
#: before it submits the job instead, where the connection's URL sets no connect_timeout.
IN_TASK_CONNECT_TIMEOUT = 10


#: What ``rowfilter.batch_history.counts`` holds per table (a key may be absent when 0).
COUNT_KEYS = ("insert", "update", "delete", "truncate", "filtered", "update_to_insert", "update_to_delete",
              "missing_update", "missing_delete")
#: The operations that change a subscriber table: a table "changed" when one of them is > 0.
CHANGING = ("insert", "update", "delete", "truncate")


class ApplyChangesOperator(RowFilterJobOperator):
    """Drain the subscription's slot to the subscriber in bounded batches (the ``apply`` job).

    One run applies consecutive micro-batches of PostgreSQL's apply worker, in one Spark application,
    until it has applied every transaction the publisher had committed (flushed) when the run started,
    or until ``time_budget`` is spent. Each batch captures up to ``max_changes`` slot rows (changes,
    and the transactions' Begin and Commit messages) from the slot into the durable change log, then
    applies about that many changes of the log to the subscriber in one transaction of its own, row
    filters evaluated on the old and new row, UPDATEs transformed, tables moving ``f`` → ``s`` → ``r``
    as the catch-up passes their copy position. A run with nothing to apply succeeds. A conflict (an
    INSERT of an existing key) fails the job with the table, key and LSN: nothing of that batch is
    applied, the run's earlier batches stay.

    :param max_changes: the bound of each batch (``--max-changes``): slot rows captured, about as many
        changes applied at once; default the job's. (templated)
    :param time_budget: start no further batch after this long (``--time-budget``): seconds, or a
        ``timedelta``; checked between batches, so a run may last one batch longer. ``0`` makes the
        run one batch. Default: no budget, the run drains. (templated)
    :param change_log: directory of the subscription's durable change log (spec key ``change_log``);
        relative to the DAG's folder. Default: the spec file's (beside the file), else
        ``$AIRFLOW_HOME/rowfilter/<subscription>/changes``. Every run of a subscription must use the
        same directory: put it on storage every worker sees, or give a URL of object storage
        (``s3://bucket/prefix/s1``, ``gs://``, ``abfs://``, ``hdfs://``; docs/change-log.md). (templated)
    :param asset_alias: name of the :class:`~airflow.sdk.AssetAlias` outlet that receives an asset
        event for each subscriber table the batch changed. Default ``rowfilter_<subscription>``
        when ``subscription`` is a plain name; ``""`` declares none. Any other ``AssetAlias`` in
        ``outlets`` receives the events too.
    :param skip_when_idle: first run the job's own steps in the task, without Spark: capture the slot
        into the change log and apply the batches that hold no change; submit the job only when a
        change is due (default). A run with nothing to apply then takes a fraction of a second and
        starts no JVM. The task must reach the publisher, and see the change log the subscriber
        records (by its id; where it sees another, or none, the job is submitted). Set False where
        only the Spark cluster reaches the publisher.

    The other parameters are those of
    :class:`~airflow_provider_rowfilter.operators.rowfilter_job.RowFilterJobOperator`.

    Returns (XCom) the batches written by this run, read from ``rowfilter.batch_history`` after the
    job: ``{"subscription": "s1", "batches": 2, "batch_ids": [7, 8], "batch_id": 8, "start_lsn":
    "0/1A2B3C", "end_lsn": "0/1A9F00", "transactions": 3, "changes": 12, "lag_bytes": 0,
    "lag_seconds": 0.4, "duration_ms": 850, "skipped_lsn": None, "counts": {"public.t1": {"insert":
    2, …}}, "changed_tables": ["public.t1"], "drained": True, "budget_exhausted": False, "tables":
    [{"table": "public.t1", "state": "r", "lsn": "0/1A9F00"}, …]}``. ``batch_id`` is the newest
    batch's, ``start_lsn`` the first's start, ``end_lsn``, the lag and the states the last's; the
    counts, ``transactions``, ``changes`` and ``duration_ms`` are totals over the batches.
    ``drained`` and ``budget_exhausted`` come from the job's summary line (None when it printed
    none). ``batch_id`` is None (and the numbers 0) when the run applied nothing.
    """

    job: ClassVar[str] = "apply"
    template_fields: Sequence[str] = (*RowFilterJobOperator.template_fields, "change_log", "max_changes",
                                      "time_budget")
    ui_color = "#b9e3cf"
    operator_extra_links = (ReplicationPageLink(),)

    def __init__(self, *, max_changes: int | str | None = None, change_log: str | None = None,
                 asset_alias: str | None = None, time_budget: float | str | timedelta | None = None,
                 skip_when_idle: bool = True, **kwargs: Any) -> None:
        alias = default_asset_alias(kwargs.get("subscription")) if asset_alias is None else asset_alias
        if alias:
            outlets = kwargs.get("outlets") or []
            outlets = list(outlets) if isinstance(outlets, (list, tuple)) else [outlets]
            if not any(isinstance(o, AssetAlias) and o.name == alias for o in outlets):
                outlets.append(AssetAlias(alias))
            kwargs["outlets"] = outlets
        super().__init__(**kwargs)
        self.max_changes = max_changes
        self.time_budget = time_budget
        self.change_log = change_log
        self.asset_alias = alias or None
        self.skip_when_idle = skip_when_idle
        self._in_task: dict[str, Any] | None = None  # the summary of a run done in the task (run_in_task)
        self._budget_spent = 0.0  # seconds of time_budget the task's own run spent before it handed over
        self._lineage: dict[str, list[tuple[str, str]]] | None = None
        self._assets: list[tuple[str, str]] = []
        self._resolved: ResolvedSpec | None = None

    # --- the spec and the job's arguments ------------------------------------------------------------
    def spec_fields(self) -> dict[str, Any]:
        return {**super().spec_fields(), "change_log": self.change_log}

    def resolve_spec(self) -> ResolvedSpec:
        resolved = self._resolved = super().resolve_spec()
        if resolved.spec.change_log is None:
            # Without a spec file the job would use a directory under its working directory, which is
            # not the same from one task to the next: the log must outlive the run.
            home = os.path.expanduser(os.environ.get("AIRFLOW_HOME") or "~/airflow")
            path = os.path.join(os.path.abspath(home), "rowfilter", resolved.spec.subscription, "changes")
            resolved = self._resolved = replace(resolved, spec=replace(resolved.spec, change_log=path))
        return resolved

    def job_arguments(self) -> list[str]:
        """The job's options; its ``--time-budget`` is what the task's own run left of ``time_budget``."""
        bound, budget = self._max_changes(), self._time_budget()
        if budget is not None:
            budget = max(0.0, round(budget - self._budget_spent, 3))
        return ([] if bound is None else ["--max-changes", str(bound)]) + \
            ([] if budget is None else ["--time-budget", f"{budget:g}"])

    def _time_budget(self) -> float | None:
        """The rendered ``time_budget`` in seconds (0 or more), or None for no budget."""
        value = self.time_budget
        if value is None or value == "":
            return None
        if isinstance(value, timedelta):
            value = value.total_seconds()
        elif isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                value = None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise SpecError(f"time_budget={self.time_budget!r} is not a number of seconds of 0 or more",
                            hint="pass time_budget=240 (seconds) or timedelta(minutes=4), or leave it out to drain")
        return float(value)

    def _max_changes(self) -> int | None:
        """The rendered ``max_changes`` as a positive integer, or None for the job's default."""
        value = self.max_changes
        if value is None or value == "":
            return None
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"max_changes={self.max_changes!r} is not a positive integer",
                            hint="pass max_changes=100000, or leave it out for the job's default")
        return value

    def short_batch(self) -> bool:
        bound = self._max_changes()
        return (DEFAULT_MAX_CHANGES if bound is None else bound) <= SHORT_BATCH_CHANGES

    # --- a run with nothing to judge, in the task --------------------------------------------------------
    def run_in_task(self, resolved: ResolvedSpec) -> bool:
        """The job's own run without Spark (flows/apply/drain.py ``without_spark``): done when no batch needs Spark
        (none has a change, or the publisher judged them: flows/apply/net_effect.py); else what it captured
        stays in the log and the job is submitted for the rest."""
        self._in_task, self._budget_spent = None, 0.0
        prefix = factory_prefix(self)
        skip_unless_subscribed(resolved, f"{prefix}_initial_sync" if prefix else None)
        if not self.skip_when_idle:
            return False
        began = time.monotonic()
        # Imported here: a DAG file that declares the operator loads none of the apply's code (nor numpy and
        # pyarrow with it) when the scheduler parses it.
        from airflow_provider_rowfilter.connection import in_task, is_transient
        from airflow_provider_rowfilter.core.spec.environment import environment
        from airflow_provider_rowfilter.flows.apply.drain import apply
        from airflow_provider_rowfilter.flows.spark_on_demand import SparkNeeded

        bound, budget = self._max_changes(), self._time_budget()
        try:
            passwords = {role: e.password for role, e in resolved.endpoints.items() if e.password}
            with in_task(passwords, connect_timeout=IN_TASK_CONNECT_TIMEOUT), environment(resolved.store_env):
                result = apply(resolved.spec, max_changes=DEFAULT_MAX_CHANGES if bound is None else bound,
                               time_budget=budget, without_spark=True)
        except SparkNeeded as e:
            # The run goes on in the job, within what the task's batches left of the time budget.
            self._budget_spent = time.monotonic() - began
            self.log.info("%s: the %s job is submitted", e, self.job)
            return False
        except UnreachableError as e:  # perhaps only the Spark cluster reaches it: the job decides, as before
            self._budget_spent = time.monotonic() - began
            self.log.warning("The task could not go on applying itself (%s): the %s job is submitted and decides. "
                             "Where only the Spark cluster reaches the databases, set skip_when_idle=False",
                             str(e).strip().splitlines()[0], self.job)
            return False
        except (RowFilterError, psycopg.Error) as e:
            # the job's own ERROR text, as when the job fails (hooks/job_output.py), in Airflow's terms
            text = in_airflow_terms(self, str(e).strip())
            self.log.error("%s", text)
            raise (AirflowException if is_transient(e) else AirflowFailException)(text) from None
        self._in_task = result.summary()
        self.log.info("Subscription %s: no batch needed Spark, the run was done in the task (%d batch(es) recorded): "
                      "the %s job is not submitted", resolved.spec.subscription, result.batches, self.job)
        return True

    # --- what the task returns -----------------------------------------------------------------------
    def before_submit(self, resolved: ResolvedSpec) -> int:
        with resolved.connect("subscriber") as conn:
            return StateReader(conn, resolved.spec.subscription).last_batch_id()

    def summary(self, resolved: ResolvedSpec, before: Any) -> dict[str, Any]:
        name = resolved.spec.subscription
        with resolved.connect("subscriber") as conn:
            reader = StateReader(conn, name)
            batches = reader.batches_after(before) if before is not None else []
            tables = reader.tables()
        if before is None:
            self.log.warning("The batch of this run is unknown: the subscriber could not be read before the job")
        result: dict[str, Any] = {
            "subscription": name, "batch_id": None, "start_lsn": None, "end_lsn": None, "transactions": 0,
            "changes": 0, "lag_bytes": None, "lag_seconds": None, "duration_ms": None, "skipped_lsn": None,
            "counts": {},
        }
        if batches:  # newest first
            last, first = batches[0], batches[-1]
            result.update(batch_id=last.id, start_lsn=first.start_lsn, end_lsn=last.end_lsn,
                          transactions=sum(b.transactions or 0 for b in batches),
                          changes=sum(b.changes or 0 for b in batches), lag_bytes=last.lag_bytes,
                          lag_seconds=last.lag_seconds, duration_ms=sum(b.duration_ms or 0 for b in batches),
                          skipped_lsn=next((b.skipped_lsn for b in batches if b.skipped_lsn), None),
                          counts=_summed(_counts(b.counts) for b in batches))
        # What only the job knows (hooks/job_output.py keeps its JSON line).
        printed = self._in_task or (self._output.result if self._output is not None and self._output.result else {})
        result.update(batches=len(batches), batch_ids=[b.id for b in reversed(batches)],
                      drained=printed.get("drained"), budget_exhausted=printed.get("budget_exhausted"))
        counts = result["counts"]
        changed = sorted(t for t, c in counts.items() if sum(c.get(k, 0) for k in CHANGING) > 0)
        read = sorted(t for t, c in counts.items() if any(c.values()))
        result["changed_tables"] = changed
        result["tables"] = [{"table": str(t.table), "state": t.state.value, "lsn": t.lsn} for t in tables]
        self._lineage = {
            "inputs": [openlineage_dataset(resolved.spec.publisher, t) for t in read] if resolved.spec.publisher else [],
            "outputs": [openlineage_dataset(resolved.spec.subscriber, t) for t in changed]
            if resolved.spec.subscriber else [],
        }
        self._assets = [(t, table_asset_uri(resolved.spec.subscriber, t)) for t in changed] \
            if resolved.spec.subscriber else []
        self._log_summary(result)
        return result

    def _log_summary(self, result: Mapping[str, Any]) -> None:
        name = result["subscription"]
        if result["batch_id"] is None:
            self.log.info("Subscription %s: no batch applied by this run", name)
        else:
            self.log.info("Subscription %s: %s batch(es) (%s) applied %s change(s) in %s transaction(s), %s -> %s, "
                          "in %s; %s%s", name, result["batches"], ", ".join(map(str, result["batch_ids"])),
                          result["changes"], result["transactions"], result["start_lsn"], result["end_lsn"],
                          "?" if result["duration_ms"] is None else duration(result["duration_ms"] / 1000),
                          batch_lag(result["lag_bytes"], result["lag_seconds"]),
                          f"; skipped the transaction at {result['skipped_lsn']}" if result["skipped_lsn"] else "")
        if result["budget_exhausted"]:
            self.log.info("The time budget (%s) stopped the run before it drained: the next run goes on",
                          self.time_budget)
        elif result["drained"]:
            self.log.info("Drained: every transaction the publisher had committed when the run started is applied")
        for table, c in sorted(result["counts"].items()):
            self.log.info("%s: %s", table, counts_text(c))
        waiting = [f"{t['table']} ({t['state']})" for t in result["tables"] if t["state"] != "r"]
        if waiting:
            self.log.info("Not ready yet: %s", ", ".join(waiting))

    # --- execution: the batch, then its asset events ----------------------------------------------------
    @clear_errors
    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]  # SparkSubmitOperator's returns None
        self._assets = []
        self._lineage = None
        self._resolved = None
        try:
            result = super().execute(context)
        except AirflowSkipException:
            raise
        except Exception:
            name = self._resolved.spec.subscription if self._resolved is not None else subscription_of(self)
            if name:
                failure_metrics(name)
            self._gauges()
            self._schedule_warnings()
            raise
        self._emit_asset_events(context, result)
        apply_metrics(result)
        self._gauges()
        self._schedule_warnings()
        return result

    def _schedule_warnings(self) -> None:
        """The schedule against the publisher's slot limits, as validate and status warn (core/slot_retention.py)."""
        if self._resolved is not None:
            for text in schedule_warnings(self._resolved):
                self.log.warning("%s", text)

    def _gauges(self) -> None:
        """Retained WAL and batch age after every run, failed or not (operators/metrics.py), when metrics are on."""
        if self._resolved is not None and metrics_on():
            gauges_now(self._resolved)

    def _emit_asset_events(self, context: Context, result: Mapping[str, Any]) -> None:
        """An asset event per changed subscriber table, on every ``AssetAlias`` outlet."""
        if not self._assets:
            return
        aliases = [o for o in self.outlets if isinstance(o, AssetAlias)]
        events = context.get("outlet_events") if isinstance(context, Mapping) else None
        if not aliases or events is None:
            self.log.info("No AssetAlias outlet (asset_alias=): no asset events for %s",
                          ", ".join(t for t, _ in self._assets))
            return
        for table, uri in self._assets:
            extra = {"subscription": result["subscription"], "table": table, "end_lsn": result.get("end_lsn"),
                     "batch_id": result.get("batch_id"), **result["counts"].get(table, {})}
            for alias in aliases:
                events[alias].add(Asset(uri), extra=extra)
        self.log.info("Asset events on %s: %s", ", ".join(a.name for a in aliases),
                      ", ".join(uri for _, uri in self._assets))

    # --- lineage -------------------------------------------------------------------------------------
    def lineage_datasets(self) -> dict[str, list[tuple[str, str]]]:
        """``{"inputs": [(namespace, name)], "outputs": […]}`` of the last run: the publisher tables the
        batch read changes of, and the subscriber tables it changed (empty before a run)."""
        return self._lineage or {"inputs": [], "outputs": []}

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: publisher tables in, subscriber tables out. None without the openlineage provider."""
        try:
            from airflow.providers.common.compat.openlineage.facet import Dataset
            from airflow.providers.openlineage.extractors import OperatorLineage
        except ImportError:
            return None
        datasets = self.lineage_datasets()
        return OperatorLineage(
            inputs=[Dataset(namespace=ns, name=name) for ns, name in datasets["inputs"]],
            outputs=[Dataset(namespace=ns, name=name) for ns, name in datasets["outputs"]],
        )


def _summed(counts: Any) -> dict[str, dict[str, int]]:
    """Per-table counts added up over batches."""
    total: dict[str, dict[str, int]] = {}
    for batch in counts:
        for table, c in batch.items():
            into = total.setdefault(table, {})
            for k, v in c.items():
                into[k] = into.get(k, 0) + v
    return total


def _counts(value: Any) -> dict[str, dict[str, int]]:
    if not isinstance(value, Mapping):
        return {}
    return {str(t): {k: int(v) for k, v in c.items() if isinstance(v, int) and v} for t, c in value.items()
            if isinstance(c, Mapping)}
