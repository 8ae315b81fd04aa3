"""The ``rowfilter`` console command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.publication import PublishAction
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.subscription_filters import (
    SubscriptionFilters,
    TableFilters,
    filters_document,
)

console = Console()
err_console = Console(stderr=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rowfilter", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="check a subscription's publications and print its effective filters")
    validate.add_argument("--spec", required=True, help="subscription spec file (YAML)")
    validate.add_argument("--json", action="store_true", help="print the effective filters as JSON")
    refresh = sub.add_parser("refresh", help="reconcile the subscription's tables with its publications "
                             "(ALTER SUBSCRIPTION … REFRESH PUBLICATION)")
    refresh.add_argument("--spec", required=True, help="subscription spec file (YAML)")
    status = sub.add_parser("status", help="per-table sync state, like pg_subscription_rel")
    status.add_argument("--spec", required=True, help="subscription spec file (YAML)")
    status.add_argument("--json", action="store_true", help="print the state as JSON")
    snapshot = sub.add_parser("snapshot", help="copy the tables waiting for their initial copy (PostgreSQL's "
                              "table sync), then record where their catch-up starts")
    snapshot.add_argument("--spec", required=True, help="subscription spec file (YAML)")
    snapshot.add_argument("--table", action="append", metavar="SCHEMA.TABLE",
                          help="copy only this table (repeatable); default every table in state i or d")
    resync = sub.add_parser("resync", help="empty a table in the subscriber and send it back to state i "
                            "(backfill); --copy copies it right away")
    resync.add_argument("--spec", required=True, help="subscription spec file (YAML)")
    resync.add_argument("--table", action="append", required=True, metavar="SCHEMA.TABLE",
                        help="the table to copy again (repeatable)")
    resync.add_argument("--copy", action="store_true", help="copy it now instead of at the next snapshot")
    demo = sub.add_parser("demo", help="run the demo on a throwaway local PostgreSQL")
    demo.add_argument("--keep", metavar="DIR", help="keep the demo's PostgreSQL and files in DIR")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rowfilter`` command; return the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "validate":
            return validate(SubscriptionSpec.load(args.spec), as_json=args.json)
        if args.command == "refresh":
            return refresh(SubscriptionSpec.load(args.spec))
        if args.command == "status":
            return status(SubscriptionSpec.load(args.spec), as_json=args.json)
        if args.command in ("snapshot", "resync"):
            return initial_copy(SubscriptionSpec.load(args.spec), args)
        if args.command == "demo":
            from airflow_provider_rowfilter.demo.run import run_demo

            return run_demo(keep=args.keep)
    except RowFilterError as e:
        err_console.print(f"[bold red]ERROR:[/] {e}", highlight=False, markup=True, soft_wrap=True)
        return 1
    return 2


def validate(spec: SubscriptionSpec, *, as_json: bool = False) -> int:
    """Validate the spec's publications against the publisher and print the effective filters."""
    from airflow_provider_rowfilter.pg.definitions import connect, load_definitions

    with connect(spec.publisher, "publisher", spec) as conn:
        definitions = load_definitions(spec, conn)
    if as_json:
        print(json.dumps(filters_document(definitions.filters, spec.subscription), indent=2))
    else:
        print_filters(spec, definitions.filters, definitions.source)
    return 0


def refresh(spec: SubscriptionSpec) -> int:
    """Run the RefreshPublication job in-process and say what it added and removed."""
    from airflow_provider_rowfilter.jobs.refresh import refresh as run_refresh

    result = run_refresh(spec)
    if not result.changed:
        console.print(f"subscription {spec.subscription}: up to date ({len(result.tables)} tables, at {result.lsn})")
        return 0
    console.print(f"subscription {spec.subscription}: refreshed at {result.lsn}")
    for name in result.added:
        console.print(f"  [green]+ {name}[/]  ({'i: waiting for its initial copy' if spec.copy_data else 'r'})")
    for name in result.removed:
        console.print(f"  [red]- {name}[/]  (no longer published; its progress is dropped)")
    if result.slot_created:
        console.print(f"  created replication slot rowfilter_{spec.subscription} (pgoutput) on the publisher")
    if result.definitions_changed and not (result.added or result.removed):
        console.print("  definitions changed: they apply to changes after this position; rows already copied "
                      "are not re-copied (as in PostgreSQL)")
    return 0


def status(spec: SubscriptionSpec, *, as_json: bool = False) -> int:
    """Print the per-table sync state (``status --json``: the contract of design.md §6)."""
    from airflow_provider_rowfilter.pg.definitions import connect
    from airflow_provider_rowfilter.pg.state import StateStore

    with connect(spec.subscriber, "subscriber", spec) as conn:
        store = StateStore(conn, spec.subscription)
        subscription = store.require_subscription()
        tables = store.tables()
    if as_json:
        print(json.dumps({
            "subscription": spec.subscription,
            "publications": subscription["publications"],
            "slot": subscription["slot_name"],
            "last_error": subscription["last_error"],
            "tables": [{"table": str(t.table), "state": t.state.value, "lsn": t.lsn, "rows_copied": t.rows_copied,
                        "last_error": t.last_error, "updated_at": t.updated_at.isoformat()} for t in tables],
        }))
        return 0
    table = Table(title=f"subscription {spec.subscription} (publications {', '.join(subscription['publications'])})")
    for col in ("table", "state", "lsn", "rows copied", "updated", "last error"):
        table.add_column(col, overflow="fold")
    for t in tables:
        colour = "green" if t.state.value == "r" else "yellow"
        table.add_row(str(t.table), f"[{colour}]{t.state.value}[/] {t.state.label}", t.lsn or "",
                      "" if t.rows_copied is None else f"{t.rows_copied:,}",
                      t.updated_at.strftime("%Y-%m-%d %H:%M:%S"), f"[red]{t.last_error}[/]" if t.last_error else "")
    console.print(table)
    return 0


def initial_copy(spec: SubscriptionSpec, args: argparse.Namespace) -> int:
    """Run the SnapshotCopy job in-process (``snapshot``, or ``resync`` first); say what each table got."""
    from rich.markup import escape

    from airflow_provider_rowfilter.core.relation import TableName
    from airflow_provider_rowfilter.jobs.snapshot import resync as run_resync
    from airflow_provider_rowfilter.jobs.snapshot import snapshot as run_snapshot

    tables = [TableName.parse(t) for t in args.table] if args.table else None
    if args.command == "resync":
        result = run_resync(spec, tables or [], copy=args.copy)
    else:
        result = run_snapshot(spec, tables)
    if not result.tables:
        console.print(f"subscription {spec.subscription}: no table waits for its initial copy")
    for t in result.tables:
        if t.error:
            continue
        done = f"{t.rows_copied:,} rows, consistent with {t.lsn}" if t.rows_copied is not None and t.lsn else ""
        console.print(f"  {escape(t.table)}: state {t.state}" + (f" ({done})" if done else "")
                      + (f" — {escape(t.note)}" if t.note else ""), highlight=False)
    if not result.ok:
        err_console.print(f"[bold red]ERROR:[/] {escape(str(result.error()))}", highlight=False, soft_wrap=True)
        return 1
    return 0


def print_filters(spec: SubscriptionSpec, filters: SubscriptionFilters, source: str) -> None:
    console.print(f"[bold]subscription[/] {spec.subscription}: publications "
                  f"{', '.join(spec.publications)} ([italic]{source}[/]) — valid")
    table = Table(show_lines=True)
    for col in ("table", "publishes", "insert filter", "update filter", "delete filter", "initial copy", "columns"):
        table.add_column(col, overflow="fold")
    def cell(t: TableFilters, action: PublishAction) -> str:
        if action not in t.actions:
            return "[dim]not published[/]"
        return t.filter_sql(action) or "[green]all rows[/]"

    for name, t in filters.tables.items():
        table.add_row(
            str(name) + ("" if t.leaves == (name,) else f"\n[dim]via {', '.join(map(str, t.leaves))}[/]"),
            ", ".join(a.value for a in PublishAction if a in t.actions),
            cell(t, PublishAction.INSERT), cell(t, PublishAction.UPDATE), cell(t, PublishAction.DELETE),
            t.copy_filter_sql or "[green]all rows[/]",
            ", ".join(t.columns) if t.columns is not None else "[green]all[/]",
        )
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
