"""The ``rowfilter`` console command.

Everything printed that comes from data (names, keys, errors, SQL) is printed as it is: the consoles
do not read Rich markup, and styles are given as :class:`rich.text.Text` styles (:func:`say`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.publication import PublishAction
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.subscription_filters import (
    SubscriptionFilters,
    TableFilters,
    filters_document,
)
from airflow_provider_rowfilter.jobs.arguments import positive

if TYPE_CHECKING:
    from airflow_provider_rowfilter.publisher.slot_health import SlotHealth
    from airflow_provider_rowfilter.subscriber.state import RelState

# markup=False: a "[/x]" in a key or "[p1, …]" in a hint is text, never a style tag.
console = Console(markup=False, highlight=False)
err_console = Console(stderr=True, markup=False, highlight=False)

#: ``rowfilter status`` ran and found the subscription broken (its slot gone or invalidated).
EXIT_BROKEN = 3


def say(*parts: str | tuple[str, str], err: bool = False) -> None:
    """Print one line: plain strings as they are, ``(text, style)`` pairs styled; never wrapped mid-line."""
    (err_console if err else console).print(Text.assemble(*parts), soft_wrap=True)


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
    refresh.add_argument("--recreate-slot", action="store_true", help="the slot was dropped: create a new one and "
                         "send every table it had positioned back to state i, emptied, for a new copy")
    status = sub.add_parser("status", help="per-table sync state, like pg_subscription_rel, and the WAL the "
                            "slot retains on the publisher; exit 3 when the subscription is broken (its slot "
                            "dropped or invalidated)")
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
    apply = sub.add_parser("apply", help="capture one batch from the slot and apply it to the subscriber "
                           "(the apply worker, one micro-batch)")
    apply.add_argument("--spec", required=True, help="subscription spec file (YAML)")
    apply.add_argument("--max-changes", type=positive, default=None, metavar="N",
                       help="bound of the batch in slot rows, at least 1 (whole transactions; default 100000)")
    apply.add_argument("--json", action="store_true", help="print the batch summary as JSON")
    skip = sub.add_parser("skip", help="skip the remote transaction finishing at an LSN once "
                          "(ALTER SUBSCRIPTION … SKIP); --lsn NONE clears it")
    skip.add_argument("--spec", required=True, help="subscription spec file (YAML)")
    skip.add_argument("--lsn", required=True, help="the finish LSN the conflict error names, e.g. 0/14C0378, or NONE")
    drop = sub.add_parser("drop", help="drop the subscription (DROP SUBSCRIPTION): its slot and capture publication "
                          "on the publisher, its state in the subscriber; its tables and their data stay")
    drop.add_argument("--spec", required=True, help="subscription spec file (YAML)")
    drop.add_argument("--keep-slot", action="store_true",
                      help="drop the subscriber side only and leave the slot on the publisher, e.g. when it cannot "
                      "be reached (ALTER SUBSCRIPTION … SET (slot_name = NONE)); the slot retains WAL until dropped")
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
            return refresh(SubscriptionSpec.load(args.spec), recreate_slot=args.recreate_slot)
        if args.command == "status":
            return status(SubscriptionSpec.load(args.spec), as_json=args.json)
        if args.command in ("snapshot", "resync"):
            return initial_copy(SubscriptionSpec.load(args.spec), args)
        if args.command == "apply":
            return apply_batch(SubscriptionSpec.load(args.spec), max_changes=args.max_changes, as_json=args.json)
        if args.command == "skip":
            return skip(SubscriptionSpec.load(args.spec), args.lsn)
        if args.command == "drop":
            return drop(SubscriptionSpec.load(args.spec), keep_slot=args.keep_slot)
    except RowFilterError as e:
        say(("ERROR:", "bold red"), " ", str(e), err=True)
        return 1
    return 2


def validate(spec: SubscriptionSpec, *, as_json: bool = False) -> int:
    """Validate the spec's publications against the publisher and print the effective filters."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.publisher.definitions import load_definitions

    with connect(spec.publisher, "publisher", spec) as conn:
        definitions = load_definitions(spec, conn)
    if as_json:
        document = filters_document(definitions.filters, spec.subscription,
                                    untranslatable_ok=definitions.filtering == "source")
        for t in document["tables"]:
            t["filtering"] = definitions.filtering
        print(json.dumps({**document, "filtering": definitions.filtering, "warnings": list(definitions.warnings)},
                         indent=2))
    else:
        print_filters(spec, definitions.filters, definitions.source, definitions.filtering)
    for text in definitions.warnings:
        say(("WARNING:", "yellow"), " ", text, err=True)
    return 0


#: How validate and status name each mode (core/spec.py ``filtering``).
FILTERING_LABELS = {"source": "source (the publisher's pgoutput)", "spark": "spark (the apply judges)"}


def refresh(spec: SubscriptionSpec, *, recreate_slot: bool = False) -> int:
    """Run the RefreshPublication job in-process and say what it added and removed."""
    from airflow_provider_rowfilter.jobs.refresh import refresh as run_refresh

    result = run_refresh(spec, recreate_slot=recreate_slot)
    if not result.changed:
        say(f"subscription {spec.subscription}: up to date ({len(result.tables)} tables, at {result.lsn})")
        return 0
    say(f"subscription {spec.subscription}: refreshed at {result.lsn}")
    for name in result.added:
        say("  ", (f"+ {name}", "green"), f"  ({'i: waiting for its initial copy' if spec.copy_data else 'r'})")
    for name in result.removed:
        say("  ", (f"- {name}", "red"), "  (no longer published; its progress is dropped)")
    if result.slot_created:
        say(f"  created replication slot rowfilter_{spec.subscription} (pgoutput) on the publisher")
    if result.definitions_changed and not (result.added or result.removed):
        say("  definitions changed: they apply to changes after this position; rows already copied "
            "are not re-copied (as in PostgreSQL)")
    return 0


def status(spec: SubscriptionSpec, *, as_json: bool = False) -> int:
    """Print the per-table sync state and the slot's WAL (``status --json``: docs/operations.md).

    Returns 0, or :data:`EXIT_BROKEN` when the slot is gone while tables are past ``i``, or invalidated.
    """
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.subscriber.state import StateReader

    with connect(spec.subscriber, "subscriber", spec) as conn:
        reader = StateReader(conn, spec.subscription)
        subscription = reader.require_subscription()
        tables = reader.tables()
        last = reader.last_batch()
    current, slot, unreachable, filtering = _publisher_view(spec, subscription.slot_name)
    warnings, broken = _slot_findings(spec, slot, unreachable, tables)
    lag = {}
    for t in tables:
        if current is not None and t.lsn is not None and t.state.value in "fsr":
            lag[t.table] = max(current - parse_lsn(t.lsn), 0)
    batch = None if last is None else {
        "id": last.id, "end_lsn": last.end_lsn, "lag_bytes": last.lag_bytes, "lag_seconds": last.lag_seconds,
        "finished_at": last.finished_at.isoformat()}
    counts = {} if last is None else last.counts
    code = EXIT_BROKEN if broken else 0
    if as_json:
        slot_doc = ({"name": subscription.slot_name, "exists": None, "error": unreachable} if slot is None
                    else {**slot.as_dict(), "error": None})
        print(json.dumps({
            "subscription": spec.subscription,
            "publications": subscription.publications,
            "filtering": filtering,
            "slot": {**slot_doc, "retained_wal_warning_bytes": spec.retained_wal_warning_bytes},
            "broken": broken,
            "warnings": warnings,
            "applied_lsn": subscription.applied_lsn,
            "skip_lsn": subscription.skip_lsn,
            "last_error": subscription.last_error,
            "last_batch": batch,
            "tables": [{"table": str(t.table), "state": t.state.value, "lsn": t.lsn,
                        "lag_bytes": lag.get(t.table),
                        "lag_seconds": batch["lag_seconds"] if batch and t.state.value == "r" else None,
                        "filtering": filtering,
                        "rows_copied": t.rows_copied, "last_batch": counts.get(str(t.table), {}),
                        "last_error": t.last_error, "updated_at": t.updated_at.isoformat()} for t in tables],
        }))
        for text in warnings:
            say(("WARNING:", "yellow"), " ", text, err=True)
        return code
    title = (f"subscription {spec.subscription} (publications {', '.join(subscription.publications)}), "
             f"filtering under each table")
    if batch:
        title += f"\nlast batch {batch['finished_at'][:19]} through {batch['end_lsn']}"
    table = Table(title=title)
    for col in ("table", "state", "lsn", "lag", "rows copied", "last batch", "last error"):
        table.add_column(col, overflow="fold")
    for t in tables:
        colour = "green" if t.state.value == "r" else "yellow"
        lag_text = ""
        if t.table in lag:
            lag_text = _size(lag[t.table])
            if batch and batch["lag_seconds"] is not None and t.state.value == "r":
                lag_text += f", {batch['lag_seconds']:.1f} s"
        done = counts.get(str(t.table), {})
        table.add_row(Text.assemble(str(t.table), (f"\n{filtering or 'filtering unknown'}", "dim")),
                      Text.assemble((t.state.value, colour), " ", t.state.label), t.lsn or "",
                      lag_text, "" if t.rows_copied is None else f"{t.rows_copied:,}",
                      " ".join(f"{k} {v:,}" for k, v in done.items()),
                      Text(t.last_error or "", style="red"))
    console.print(table)
    say(_slot_line(subscription.slot_name, slot))
    if subscription.last_error:
        say(("last error:", "red"), " ", subscription.last_error, err=True)
    for text in warnings:
        say(("WARNING:", "yellow"), " ", text, err=True)
    if broken:
        say(("BROKEN:", "bold red"), " ", broken, err=True)
    return code


def _publisher_view(spec: SubscriptionSpec, slot_name: str
                    ) -> tuple[int | None, SlotHealth | None, str | None, str | None]:
    """``(current WAL position, slot, None, filtering)``, or ``(None, None, why, None)`` when the publisher
    cannot be reached: status still prints the subscriber's side. ``filtering`` is the mode the next
    capture takes (core/spec.py), or why it refuses."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.publisher.slot_health import read_slot

    try:
        with connect(spec.publisher, "publisher", spec) as pub:
            current, slot = read_slot(pub, slot_name)
            version = pub.info.server_version
    except RowFilterError as e:
        return None, None, e.message + (f" ({e.detail})" if e.detail else ""), None
    try:
        filtering = spec.filtering_mode(version)
    except RowFilterError as e:
        filtering = f"refused: {e.message}"
    return parse_lsn(current), slot, None, filtering


def _slot_findings(spec: SubscriptionSpec, slot: SlotHealth | None, unreachable: str | None,
                   tables: Sequence[RelState]) -> tuple[list[str], str | None]:
    """What status warns about, and why the subscription is broken (None when it is not)."""
    if slot is None:
        return [f"{unreachable}: the replication slot's state is unknown, and lag was not measured"], None
    name = f'replication slot "{slot.name}"'
    past = [str(t.table) for t in tables if t.state.value != "i"]
    if not slot.exists:
        if not past:
            return [f"{name} does not exist on the publisher; `rowfilter refresh` creates it"], None
        return [], (f"{name} does not exist on the publisher, but {', '.join(past)} "
                    f"{'is' if len(past) == 1 else 'are'} past the initial copy: the changes since "
                    f"{'its position' if len(past) == 1 else 'their positions'} are lost to this subscription. "
                    "Copy them again: see `rowfilter refresh --help`")
    if slot.lost:
        return [], (f"{name} was invalidated (wal_status lost): the publisher removed WAL it still needed, "
                    "past max_slot_wal_keep_size; the changes since the tables' positions are lost. Drop the "
                    "subscription (`rowfilter drop`) and subscribe again, or see `rowfilter refresh --help`")
    warnings = []
    if slot.wal_status == "unreserved":
        warnings.append(f"{name} holds more WAL than max_slot_wal_keep_size allows (wal_status unreserved): "
                        "the next checkpoint on the publisher removes it and invalidates the slot; run the apply "
                        "now, or raise max_slot_wal_keep_size")
    threshold = spec.retained_wal_warning_bytes
    if slot.retained_bytes is not None and slot.retained_bytes > threshold:
        warnings.append(f"{name} retains {_size(slot.retained_bytes)} of WAL on the publisher, more than "
                        f"retained_wal_warning ({_size(threshold)}): is the subscription's apply running? "
                        "A subscription you no longer need: `rowfilter drop`")
    return warnings, None


def _slot_line(name: str, slot: SlotHealth | None) -> str:
    if slot is None:
        return f"slot {name}: unknown (the publisher cannot be reached)"
    if not slot.exists:
        return f"slot {name}: missing on the publisher"
    parts = [f"wal_status {slot.wal_status or 'n/a'}",
             "retains " + ("nothing" if slot.retained_bytes is None else _size(slot.retained_bytes)) + " of WAL",
             "active" if slot.active else "inactive"]
    if slot.safe_wal_size is not None:
        parts.append(f"{_size(max(slot.safe_wal_size, 0))} more before max_slot_wal_keep_size")
    return f"slot {name}: " + ", ".join(parts)


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def apply_batch(spec: SubscriptionSpec, *, max_changes: int | None, as_json: bool) -> int:
    """Run ApplyChanges in-process: one captured batch, applied in one subscriber transaction."""
    from airflow_provider_rowfilter.jobs.apply import apply
    from airflow_provider_rowfilter.publisher.capture import DEFAULT_MAX_CHANGES

    result = apply(spec, max_changes=DEFAULT_MAX_CHANGES if max_changes is None else max_changes)
    if as_json:
        print(json.dumps(result.summary()))
        return 0
    say(f"subscription {spec.subscription}: applied {result.changes:,} changes through "
        f"{result.end_lsn or '-'} in {result.duration_ms / 1000:.1f} s")
    for name, counts in sorted(result.tables.items()):
        say(f"  {name}: " + (", ".join(f"{k} {v:,}" for k, v in counts.items()) or "nothing"))
    if result.skipped_lsn:
        say(f"  skipped the remote transaction finished at {result.skipped_lsn}")
    return 0


def skip(spec: SubscriptionSpec, lsn: str) -> int:
    """``ALTER SUBSCRIPTION … SKIP (lsn = …)``: the next apply drops that one remote transaction."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.subscriber.state import StateStore

    value = None if lsn.upper() == "NONE" else format_lsn(parse_lsn(lsn))
    with connect(spec.subscriber, "subscriber", spec) as conn:
        store = StateStore(conn, spec.subscription)
        row = store.require_subscription()
        applied = row.applied_lsn
        if value is not None and applied is not None and parse_lsn(value) < parse_lsn(applied):
            raise RowFilterError(f"skip WAL location (LSN {value}) must be greater than origin LSN {applied}",
                                 hint="name the LSN the conflict error gave (the transaction's finish LSN)")
        store.set_skip_lsn(value)
    say(f"subscription {spec.subscription}: " + (
        f"the remote transaction finished at {value} will be skipped by the next apply" if value
        else "skip-LSN cleared"))
    return 0


def drop(spec: SubscriptionSpec, *, keep_slot: bool) -> int:
    """``DROP SUBSCRIPTION``: run the drop in-process and say what went; nothing left to drop is not an error."""
    from airflow_provider_rowfilter.jobs.drop import drop as run_drop

    result = run_drop(spec, keep_slot=keep_slot)
    if not result.dropped:
        say(f"subscription {spec.subscription}: nothing to drop")
    else:
        say(f"subscription {spec.subscription}: dropped")
    if result.slot_dropped:
        held = "" if result.slot_retained_bytes is None else f" (it retained {_size(result.slot_retained_bytes)} of WAL)"
        say("  ", (f"- replication slot {result.slot}", "red"), f" on the publisher{held}")
    if result.publication_dropped:
        say("  ", (f"- publication {result.publication}", "red"), " on the publisher")
    if result.state_dropped:
        counted = [f"{n} {word}{'' if n == 1 else plural}" for n, word, plural in (
            (len(result.tables), "table", "s"), (result.refreshes, "refresh", "es"), (result.batches, "batch", "es"))]
        say("  ", ("- state in the subscriber", "red"), f": {counted[0]} ({', '.join(result.tables)}), "
            f"{counted[1]} and {counted[2]} of history")
    if result.change_log_moved_to:
        say(f"  change log moved to {result.change_log_moved_to} (delete it when you no longer need it)")
    for note in result.left_alone:
        say(("left alone:", "yellow"), " ", note, err=True)
    if keep_slot:
        say(f"  --keep-slot: the publisher was not contacted; if replication slot {result.slot} still exists there, "
            f"it retains WAL until it is dropped: run `rowfilter drop` again without --keep-slot once the publisher "
            f"is reachable, or SELECT pg_drop_replication_slot('{result.slot}') and DROP PUBLICATION "
            f"{result.publication} on it")
    if result.state_dropped:
        say("  the subscriber's tables and their data are kept")
    return 0


def initial_copy(spec: SubscriptionSpec, args: argparse.Namespace) -> int:
    """Run the SnapshotCopy job in-process (``snapshot``, or ``resync`` first); say what each table got."""
    from airflow_provider_rowfilter.core.relation import TableName
    from airflow_provider_rowfilter.jobs.snapshot import initial_copy
    from airflow_provider_rowfilter.jobs.snapshot import resync as run_resync

    tables = [TableName.parse(t) for t in args.table] if args.table else None
    if args.command == "resync":
        result = run_resync(spec, tables or [], copy=args.copy)
    else:
        result = initial_copy(spec, tables)
    if not result.tables:
        say(f"subscription {spec.subscription}: no table waits for its initial copy")
    for t in result.tables:
        if t.error:
            continue
        done = f"{t.rows_copied:,} rows, consistent with {t.lsn}" if t.rows_copied is not None and t.lsn else ""
        say(f"  {t.table}: state {t.state}" + (f" ({done})" if done else "") + (f" — {t.note}" if t.note else ""))
    if not result.ok:
        say(("ERROR:", "bold red"), " ", str(result.error()), err=True)
        return 1
    return 0


def print_filters(spec: SubscriptionSpec, filters: SubscriptionFilters, source: str, filtering: str = "spark") -> None:
    say(("subscription", "bold"), f" {spec.subscription}: publications {', '.join(spec.publications)} (",
        (source, "italic"), f") — valid; filtering: {FILTERING_LABELS[filtering]}")
    table = Table(show_lines=True)
    for col in ("table", "publishes", "insert filter", "update filter", "delete filter", "initial copy", "columns"):
        table.add_column(col, overflow="fold")
    def cell(t: TableFilters, action: PublishAction) -> Text:
        if action not in t.actions:
            return Text("not published", style="dim")
        return Text(t.filter_sql(action) or "all rows", style="" if t.filter_sql(action) else "green")

    for name, t in filters.tables.items():
        table.add_row(
            Text.assemble(str(name), ("" if t.leaves == (name,) else (f"\nvia {', '.join(map(str, t.leaves))}", "dim")),
                          (f"\nfiltering: {filtering}", "dim")),
            ", ".join(a.value for a in PublishAction if a in t.actions),
            cell(t, PublishAction.INSERT), cell(t, PublishAction.UPDATE), cell(t, PublishAction.DELETE),
            Text(t.copy_filter_sql or "all rows", style="" if t.copy_filter_sql else "green"),
            Text(", ".join(t.columns) if t.columns is not None else "all", style="" if t.columns is not None else "green"),
        )
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
