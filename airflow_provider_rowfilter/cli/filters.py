"""``rowfilter validate``: the publications checked by PostgreSQL's rules, and each table's effective filters."""

from __future__ import annotations

import json

from rich.text import Text

from airflow_provider_rowfilter.cli.console import console, say
from airflow_provider_rowfilter.console.output import Column, output_format, print_table
from airflow_provider_rowfilter.core.publication.model import PublishAction
from airflow_provider_rowfilter.core.publication.subscription_filters import (
    SubscriptionFilters,
    TableFilters,
    filters_document,
)
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec


def validate(spec: SubscriptionSpec, *, fmt: str | None = None, what_if: str | None = None) -> int:
    """Validate the spec's publications against the publisher and print the effective filters (``what_if``: an
    ALTER PUBLICATION judged instead, publisher/what_if.py)."""
    if what_if is not None:
        return _what_if(spec, what_if, fmt)
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.core.slot_retention import schedule_risks
    from airflow_provider_rowfilter.core.spec.schedule import longest_gap
    from airflow_provider_rowfilter.publisher.capture_objects import capture_names
    from airflow_provider_rowfilter.publisher.definitions import load_definitions
    from airflow_provider_rowfilter.publisher.readiness import readiness, spec_standbys
    from airflow_provider_rowfilter.publisher.slot_health import read_retention
    from airflow_provider_rowfilter.publisher.standby import check_capture_source

    with connect(spec.publisher, "publisher", spec) as conn:
        definitions = load_definitions(spec, conn)
        # What a standby as the publisher lacks (refused), and what the schedule risks (core/slot_retention.py).
        warnings = [*definitions.warnings, *check_capture_source(conn, definitions.filtering),
                    *schedule_risks(read_retention(conn), longest_gap(spec.apply_schedule),
                                    None if spec.apply_schedule is None else str(spec.apply_schedule))]
        standbys = readiness(conn, capture_names(spec.subscription)[0], spec_standbys(spec)) if spec.standbys else []
    warnings += [f"standby {r.standby} is not ready to take over the slot: " + "; ".join(r.problems)
                 for r in standbys if not r.ready]
    warnings += _subscriber_warnings(spec)
    if fmt == "json":
        document = filters_document(definitions.filters, spec.subscription,
                                    untranslatable_ok=definitions.filtering == "source")
        for t in document["tables"]:
            t["filtering"] = definitions.filtering
        print(json.dumps({**document, "filtering": definitions.filtering, "warnings": warnings,
                          "standbys": [r.as_dict() for r in standbys]}, indent=2))
    else:
        print_filters(spec, definitions.filters, definitions.source, fmt, definitions.filtering)
        for r in standbys:
            say(f"standby {r.standby}: " + ("failover ready" if r.ready else "NOT failover ready"))
    for text in warnings:
        say(("WARNING:", "yellow"), " ", text, err=True)
    return 0


def _what_if(spec: SubscriptionSpec, statement: str, fmt: str | None) -> int:
    """``validate --what-if``: each table's rows entering and leaving, nothing run or written."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.publisher.what_if import what_if

    with connect(spec.publisher, "publisher", spec) as conn:
        found = what_if(spec, conn, statement)
    if fmt == "json":
        print(json.dumps(found.as_dict(), indent=2))
        return 0
    say(f"subscription {spec.subscription}: if the publisher ran {found.statement}")
    for t in found.tables:
        say(f"  {t.describe()}")
    say("(nothing was run or written; after the real statement, `rowfilter refresh` then `rowfilter reconcile` "
        "brings each table there in place, or reconcile: true does it at the refresh)")
    return 0


def _subscriber_warnings(spec: SubscriptionSpec) -> list[str]:
    """What validate warns about the subscriber, when the spec names one it can reach (validate needs only the
    publisher): its cluster nearing max_active_replication_origins (subscriber/replication_origin.py)."""
    if not spec.subscriber:
        return []
    import psycopg

    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.core.errors import RowFilterError
    from airflow_provider_rowfilter.subscriber.replication_origin import origin_capacity_warning

    try:
        with connect(spec.subscriber, "subscriber", spec, connect_timeout="5") as sub:
            found = origin_capacity_warning(sub)
    except (RowFilterError, psycopg.Error):
        return []  # validate's subject is the publisher: a subscriber not made yet is no warning
    return [found] if found else []


#: How validate and status name each mode (core/spec/subscription.py ``filtering``).
FILTERING_LABELS = {"source": "source (the publisher's pgoutput)", "spark": "spark (the apply judges)"}


#: The columns of ``rowfilter validate`` (a column is added here and in :func:`print_filters`).
FILTER_COLUMNS = (Column("table", whole=True), Column("filtering", whole=True), Column("publishes"),
                  Column("insert filter"), Column("update filter"),
                  Column("delete filter"), Column("initial copy"), Column("columns"))


def print_filters(spec: SubscriptionSpec, filters: SubscriptionFilters, source: str, fmt: str | None = None,
                  filtering: str = "spark") -> None:
    title = [Text.assemble(("subscription", "bold"), f" {spec.subscription}: publications "
                           f"{', '.join(spec.publications)} (", (source, "italic"),
                           f") — valid; filtering: {FILTERING_LABELS[filtering]}")]

    def cell(t: TableFilters, action: PublishAction) -> Text:
        if action not in t.actions:
            return Text("not published", style="dim")
        return Text(t.filter_sql(action) or "all rows", style="" if t.filter_sql(action) else "green")

    rows: list[list[str | Text]] = []
    for name, t in filters.tables.items():
        rows.append([
            Text.assemble(str(name), ("" if t.leaves == (name,) else (f"\nvia {', '.join(map(str, t.leaves))}", "dim"))),
            filtering,
            ", ".join(a.value for a in PublishAction if a in t.actions),
            cell(t, PublishAction.INSERT), cell(t, PublishAction.UPDATE), cell(t, PublishAction.DELETE),
            Text(t.copy_filter_sql or "all rows", style="" if t.copy_filter_sql else "green"),
            Text(", ".join(t.columns) if t.columns is not None else "all", style="" if t.columns is not None else "green"),
        ])
    print_table(console, FILTER_COLUMNS, rows, fmt=fmt or output_format(None, console), title=title, show_lines=True)
