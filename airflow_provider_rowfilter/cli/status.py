"""``rowfilter status``: per-table state, position and lag, the last batch, checks, conflicts and the slot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text

from airflow_provider_rowfilter.cli.console import EXIT_BROKEN, console, say
from airflow_provider_rowfilter.console.output import Column, output_format, print_table
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.slot_retention import Exposure, exposures
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.humane import ago, counts_text, duration, size

if TYPE_CHECKING:
    from datetime import datetime

    import psycopg

    from airflow_provider_rowfilter.subscriber.conflicts import ConflictStats
    from airflow_provider_rowfilter.subscriber.state import BatchRecord, RelState, StateReader, TableCheckRecord


#: The columns of ``rowfilter status`` (a column is added here and in :func:`_status_row`).
STATUS_COLUMNS = (Column("table", whole=True), Column("filtering", whole=True, detail=True), Column("state", whole=True),
                  Column("lsn", whole=True), Column("behind now", whole=True),
                  Column("rows copied", whole=True, detail=True), Column("last batch", detail=True),
                  Column("last error", detail=True))


def status(spec: SubscriptionSpec, *, fmt: str | None = None) -> int:
    """Print the per-table sync state and the slot's WAL (``status --json``: docs/operations.md); ``fmt``
    None: a table on a terminal, plain rows elsewhere (console/output.py).

    Returns 0, or :data:`EXIT_BROKEN` when the slot is gone while tables are past ``i``, or invalidated.
    """
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.publisher.slot_report import findings, publisher_view, readiness_lines, slot_line
    from airflow_provider_rowfilter.subscriber import conflicts
    from airflow_provider_rowfilter.subscriber.replication_origin import origin_capacity_warning
    from airflow_provider_rowfilter.subscriber.state import StateReader, apply_running_for, relation_exists

    with connect(spec.subscriber, "subscriber", spec) as conn:
        reader = StateReader(conn, spec.subscription)
        subscription = reader.require_subscription()
        tables = reader.tables()
        last = reader.last_batch()
        checks = reader.checks()
        conflict_stats = conflicts.read(conn, spec.subscription) if relation_exists(conn, "conflict_stats") else None
        running = apply_running_for(conn, spec.subscription)
        now = conn.execute("SELECT clock_timestamp()").fetchall()[0][0]  # the clock finished_at was written by
        origins = origin_capacity_warning(conn)
        schema = _schema_differences(spec, conn, reader, tables)
    view = publisher_view(spec, subscription.slot_name,
                          [(str(t.table), t.lsn) for t in tables if t.state.value == "f" and t.lsn])
    current, slot, unreachable, filtering = view.current, view.slot, view.unreachable, view.filtering
    warnings, broken = findings(spec, view, [str(t.table) for t in tables if t.state.value != "i"])
    warnings += [origins] if origins else []
    fmt = fmt or output_format(None, console)
    lag = {}
    for t in tables:
        if current is not None and t.lsn is not None and t.state.value in "fsr":
            lag[t.table] = max(current - parse_lsn(t.lsn), 0)
    batch = None if last is None else {
        "id": last.id, "end_lsn": last.end_lsn, "lag_bytes": last.lag_bytes, "lag_seconds": last.lag_seconds,
        "finished_at": last.finished_at.isoformat(), "age_seconds": round((now - last.finished_at).total_seconds(), 3)}
    code = EXIT_BROKEN if broken else 0
    counting = [] if slot is None or not slot.exists or slot.lost or view.retention is None else exposures(
        view.retention, active=slot.active, inactive_since=slot.inactive_since, wal_status=slot.wal_status,
        safe_wal_size=slot.safe_wal_size, now=now)
    state = subscription_state(subscription.enabled, counting)
    if fmt == "json":
        slot_doc = ({"name": subscription.slot_name, "exists": None, "error": unreachable} if slot is None
                    else {**slot.as_dict(), "error": None})
        print(json.dumps({
            "subscription": spec.subscription,
            "publications": subscription.publications,
            "measured_at": now.isoformat(),
            "filtering": filtering,
            "slot": {**slot_doc, "retained_wal_warning_bytes": spec.retained_wal_warning_bytes},
            "retention": None if view.retention is None else view.retention.as_dict(),
            "standbys": [r.as_dict() for r in view.standbys],
            "broken": broken,
            "state": None if state is None else {"name": state[0], "reason": state[1]},
            "apply_running_seconds": running,
            "exposures": [e.as_dict() for e in counting],
            "warnings": warnings,
            "enabled": subscription.enabled,
            "applied_lsn": subscription.applied_lsn,
            "skip_lsn": subscription.skip_lsn,
            "last_error": subscription.last_error,
            "last_batch": batch,
            "conflicts": None if conflict_stats is None else conflict_stats.as_dict(),
            "schema_changes": spec.schema_changes,
            "schema_differences": schema,
            "tables": [{"table": str(t.table), "state": t.state.value, "lsn": t.lsn,
                        "lag_bytes": lag.get(t.table),
                        "lag_seconds": last.lag_seconds if last is not None and _in_last_batch(t, last) else None,
                        "filtering": filtering,
                        "rows_copied": t.rows_copied,
                        "last_batch": last.counts.get(str(t.table), {}) if last is not None and _in_last_batch(t, last)
                        else {},
                        "last_error": t.last_error, "updated_at": t.updated_at.isoformat(),
                        "reconcile_since": t.reconcile_since.isoformat() if t.reconcile_since else None,
                        "last_check": _check_doc(checks.get(t.table))} for t in tables],
        }))
        for text in warnings:
            say(("WARNING:", "yellow"), " ", text, err=True)
        return code
    title = [Text(f"subscription {spec.subscription} (publications {', '.join(subscription.publications)})")]
    if not subscription.enabled:
        title[0].append("  DISABLED: nothing is applied until `rowfilter enable`", style="bold yellow")
    if last is not None:
        title.append(Text(_batch_line(last, now)))
    rows = [_status_row(t, lag.get(t.table), last, filtering) for t in tables]
    print_table(console, STATUS_COLUMNS, rows, fmt=fmt, title=[] if fmt == "tsv" else title)
    if fmt != "tsv":
        say(slot_line(subscription.slot_name, view))
        if running is not None:
            say(("apply:", "cyan"), f" one runs now, for {duration(running)} (it holds the subscription's apply lock)")
        if state is not None:
            say((f"{state[0].upper()}:", "bold red" if state[0] == "at risk" else "yellow"), " ", state[1])
        for e in counting:
            if not e.at_risk:
                say(("slot clock:", "cyan"), f" it would be {e.describe()}")
        for line in readiness_lines(view):
            say(line)
        for parts in _check_lines(tables, checks, now):
            say(*parts)
        if conflict_stats is not None and any(conflict_stats.total.values()):
            say(("conflicts:", "yellow"), " ", _conflict_line(conflict_stats))
        for line in schema or ():
            say(("schema:", "yellow"), " ", line, f" ({_SCHEMA_NEXT[spec.schema_changes]})")
    if subscription.last_error:
        say(("last error:", "red"), " ", subscription.last_error, err=True)
    for text in warnings:
        say(("WARNING:", "yellow"), " ", text, err=True)
    if broken:
        say(("BROKEN:", "bold red"), " ", broken, err=True)
    return code


_SCHEMA_NEXT = {"stop": "schema_changes: stop: a batch that carries it stops until you change the subscriber",
                "follow": "schema_changes: follow: the batch that carries it follows it",
                "follow_drops": "schema_changes: follow_drops: the batch that carries it follows it"}


def _schema_differences(spec: SubscriptionSpec, sub: psycopg.Connection, reader: StateReader,
                        tables: Sequence[RelState]) -> list[str] | None:
    """How the tables past their copy differ from the publisher's now (apply/schema_follow.py); None: unreadable."""
    from psycopg import Error as DatabaseError

    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.core.errors import RowFilterError
    from airflow_provider_rowfilter.flows.apply.schema_follow import pending_differences

    refresh = reader.last_refresh()
    lists = {} if refresh is None else {t["table"]: t.get("columns") for t in refresh.definitions.get("tables", ())}
    applied = [(t.table, lists.get(str(t.table))) for t in tables if t.state.value in "fsr"]
    if not applied:
        return []
    try:
        with connect(spec.publisher, "publisher", spec) as pub:
            return pending_differences(pub, sub, applied)
    except (RowFilterError, DatabaseError):
        return None


def subscription_state(enabled: bool, counting: Sequence[Exposure]) -> tuple[str, str] | None:
    """``("at risk", why)`` when the publisher is about to invalidate the slot, ``("paused", why)`` while the
    subscription is disabled, else None (the Replication page also says a paused incremental-sync DAG)."""
    risky = [e for e in counting if e.at_risk]
    if risky:
        return "at risk", "; ".join(f"its slot would be {e.describe()}" for e in risky) + (
            "; run the apply now (or the watch DAG's slot guard)" if enabled else
            "; the subscription is disabled: `rowfilter enable`, or let the watch DAG's slot guard read the slot")
    if not enabled:
        return "paused", ("the subscription is disabled (`rowfilter disable`): nothing is applied until `rowfilter "
                          "enable`; the watch DAG's slot guard keeps its slot read meanwhile")
    return None


def _conflict_line(stats: ConflictStats) -> str:
    """The running conflict counts (rowfilter.subscription_stats): in total, then per table."""
    def some(counts: dict[str, int]) -> str:
        return ", ".join(f"{kind} {n:,}" for kind, n in counts.items() if n)
    since = f" since {stats.stats_reset:%Y-%m-%d %H:%M:%S %Z}" if stats.stats_reset else ""
    return (f"{some(stats.total)}{since} (" + "; ".join(f"{t}: {some(c)}" for t, c in stats.tables.items() if any(
        c.values())) + "); `rowfilter reset-conflicts` resets them")


def _check_doc(check: TableCheckRecord | None) -> dict | None:
    """A table's last verify or reconcile in ``status --json``."""
    if check is None:
        return None
    keys = ("missing", "extra", "different", "inserted", "updated", "deleted", "rows", "examples", "seconds")
    return {"kind": check.kind, "lsn": check.lsn, "clean": check.clean, "checked_at": check.checked_at.isoformat(),
            **{k: check.result.get(k) for k in keys}}


def _check_lines(tables: Sequence[RelState], checks: dict, now: datetime) -> list[tuple[str | tuple[str, str], ...]]:
    """One line per table a reconcile holds, or that was verified or reconciled: when, at which LSN, what it found."""
    lines: list[tuple[str | tuple[str, str], ...]] = []
    for t in tables:
        if t.reconcile_since is not None:
            lines.append(((f"{t.table}:", "yellow"), f" a reconcile holds it in d since {ago(t.reconcile_since, now)} "
                          "(run `rowfilter reconcile` if none is running)"))
        check = checks.get(t.table)
        if check is None:
            continue
        r = check.result
        if check.kind == "reconcile":
            found = f"inserted {r.get('inserted', 0):,}, updated {r.get('updated', 0):,}, deleted {r.get('deleted', 0):,}"
        elif check.clean:
            found = "equal to the publisher's rows"
        else:
            found = ", ".join(f"{r.get(k, 0):,} {k}" for k in ("missing", "extra", "different") if r.get(k))
        lines.append(((f"{t.table}:", "green" if check.clean else "red"),
                      f" {check.kind} {ago(check.checked_at, now)} at {check.lsn}: {found}"))
    return lines


def _in_last_batch(t: RelState, last: BatchRecord | None) -> bool:
    """Whether the table is where the last batch left it (``r`` at its end): else the batch's counts and lag
    are another life of the table's (it was reset to ``i`` or copied again since)."""
    return (last is not None and last.end_lsn is not None and t.state.value == "r" and t.lsn is not None
            and parse_lsn(t.lsn) == parse_lsn(last.end_lsn))


def _batch_line(last: BatchRecord, now: datetime) -> str:
    """When the last batch was applied, how far it reached, and how late it was then (not now)."""
    line = (f"last batch {last.id} applied {ago(last.finished_at, now)} ({last.finished_at:%Y-%m-%d %H:%M:%S %Z}), "
            f"through {last.end_lsn}")
    if last.lag_seconds is not None:
        line += f": it was {duration(last.lag_seconds)} behind the publisher then"
    return line


def _status_row(t: RelState, behind: int | None, last: BatchRecord | None, filtering: str | None) -> list[str | Text]:
    colour = "green" if t.state.value == "r" else "yellow"
    counts = last.counts.get(str(t.table), {}) if last is not None and _in_last_batch(t, last) else {}
    return [str(t.table), filtering or "unknown", Text.assemble((t.state.value, colour), " ", t.state.label),
            t.lsn or "",
            "" if behind is None else size(behind), "" if t.rows_copied is None else f"{t.rows_copied:,}",
            counts_text(counts) if counts else "", Text(t.last_error or "", style="red")]
