"""Metrics of the subscriptions through Airflow's own metrics (StatsD or OpenTelemetry, as configured).

Airflow's ``[metrics]`` section decides where they go (``statsd_on``, ``otel_on``); with neither, they
are dropped, as Airflow's own are. Plain StatsD has no tags, so the subscription (and the table) is
part of each name; the same values also carry ``subscription``/``table`` tags for backends that keep
tags (DogStatsD, OpenTelemetry). Names are under ``rowfilter.`` (docs/operations.md lists them):

- ``rowfilter.<subscription>.apply.runs`` / ``.changes`` / ``.transactions`` / ``.batches`` (counters of the
  successful runs), ``.apply.failures`` (counter: runs that failed, retried or not), ``.apply.duration``
  (timing, ms);
- ``rowfilter.<subscription>.lag_bytes`` / ``.lag_seconds`` (gauges: the WAL behind the publisher's
  position and the commit-time lag at the end of the last batch);
- ``rowfilter.<subscription>.<schema>.<table>.<operation>`` (counters: ``insert``, ``update``, …);
- ``rowfilter.<subscription>.conflicts.<type>`` (counters, tagged with the table: the skipped conflicts by
  PostgreSQL 18's type, ``update_missing``, ``delete_missing``, and the applied ``update_origin_differs``,
  ``delete_origin_differs``; the running totals are in the subscriber,
  ``rowfilter.subscription_stats``);
- ``rowfilter.<subscription>.retained_wal_bytes`` and ``.batch_age_seconds`` (gauges, measured after every
  ApplyChanges run, failed or not, and by
  :class:`~airflow_provider_rowfilter.operators.subscription_lag.SubscriptionLagCheckOperator`): a failing
  subscription's gauges keep growing instead of freezing at the last success.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from airflow.sdk.observability import stats

from airflow_provider_rowfilter.subscriber.conflicts import conflicts_of

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _part(name: str) -> str:
    """One dot-separated part of a metric name: StatsD's safe characters only (a table may be ``"Order Items"``)."""
    return _UNSAFE.sub("_", name) or "_"


def metric(subscription: str, *parts: str) -> str:
    return ".".join(["rowfilter", _part(subscription), *parts])


def apply_metrics(result: Mapping[str, Any]) -> None:
    """What one ApplyChanges run did (its XCom summary)."""
    name = str(result["subscription"])
    tags = {"subscription": name}
    stats.incr(metric(name, "apply", "runs"), tags=tags)
    for key in ("changes", "transactions", "batches"):
        if result.get(key):
            stats.incr(metric(name, "apply", key), int(result[key]), tags=tags)
    if result.get("duration_ms") is not None:
        stats.timing(metric(name, "apply", "duration"), float(result["duration_ms"]), tags=tags)
    for key in ("lag_bytes", "lag_seconds"):
        if result.get(key) is not None:
            stats.gauge(metric(name, key), float(result[key]), tags=tags)
    for table, counts in (result.get("counts") or {}).items():
        schema, _, relname = str(table).partition(".")
        for operation, n in counts.items():
            if n:
                stats.incr(metric(name, _part(schema), _part(relname), _part(operation)), int(n),
                           tags={**tags, "table": str(table), "operation": operation})
        for kind, n in conflicts_of(counts).items():  # PostgreSQL 18's names (pg_stat_subscription_stats confl_*)
            stats.incr(metric(name, "conflicts", kind), n, tags={**tags, "table": str(table), "conflict": kind})


def lag_metrics(subscription: str, retained_wal_bytes: int | None, batch_age_seconds: float | None) -> None:
    """What the lag check measured."""
    tags = {"subscription": subscription}
    if retained_wal_bytes is not None:
        stats.gauge(metric(subscription, "retained_wal_bytes"), float(retained_wal_bytes), tags=tags)
    if batch_age_seconds is not None:
        stats.gauge(metric(subscription, "batch_age_seconds"), float(batch_age_seconds), tags=tags)


def check_metrics(result: Mapping[str, Any]) -> None:
    """What a verify or reconcile found per table (its XCom): ``rowfilter.<subscription>.<schema>.<table>.<kind>.``
    ``missing`` / ``extra`` / ``different`` / ``rows`` (gauges: the last one stands) and, for a reconcile,
    ``inserted`` / ``updated`` / ``deleted`` (counters)."""
    name = str(result["subscription"])
    for check in result.get("tables") or ():
        table = str(check["table"])
        schema, _, relname = table.partition(".")
        kind = str(check.get("kind") or "verify")
        tags = {"subscription": name, "table": table}
        for key in ("missing", "extra", "different", "rows"):
            stats.gauge(metric(name, _part(schema), _part(relname), kind, key), float(check.get(key) or 0), tags=tags)
        for key in ("inserted", "updated", "deleted"):
            if check.get(key):
                stats.incr(metric(name, _part(schema), _part(relname), kind, key), int(check[key]), tags=tags)


def failure_metrics(subscription: str) -> None:
    """One failed ApplyChanges run (a retry is one more)."""
    stats.incr(metric(subscription, "apply", "failures"), tags={"subscription": subscription})


def metrics_on() -> bool:
    """Whether Airflow sends metrics anywhere (``[metrics] statsd_on`` or ``otel_on``): else nothing is measured."""
    from airflow.configuration import conf

    return any(conf.getboolean("metrics", key, fallback=False) for key in ("statsd_on", "otel_on"))
