"""The ``rowfilter`` console command.

Everything printed that comes from data (names, keys, errors, SQL) is printed as it is: the consoles
do not read Rich markup, and styles are given as :class:`rich.text.Text` styles (:func:`say`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from airflow_provider_rowfilter import __version__
from airflow_provider_rowfilter.cli_output import FORMATS, Column, output_format, print_table
from airflow_provider_rowfilter.cli_progress import progress_bars, wants_bars
from airflow_provider_rowfilter.core.errors import RowFilterError, SpecError
from airflow_provider_rowfilter.core.filters.subscription_filters import (
    SubscriptionFilters,
    TableFilters,
    filters_document,
)
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.publication import PublishAction
from airflow_provider_rowfilter.core.spec import CONN_ID, SubscriptionSpec
from airflow_provider_rowfilter.humane import PROGRESS_LOGGER, ago, batch_lag, counts_text, duration, size
from airflow_provider_rowfilter.jobs.arguments import interval, positive, seconds

if TYPE_CHECKING:
    from datetime import datetime

    from airflow_provider_rowfilter.subscriber.conflicts import ConflictStats
    from airflow_provider_rowfilter.subscriber.state import BatchRecord, RelState, TableCheckRecord

# markup=False: a "[/x]" in a key or "[p1, …]" in a hint is text, never a style tag.
console = Console(markup=False, highlight=False)
err_console = Console(stderr=True, markup=False, highlight=False)

#: ``rowfilter status`` ran and found the subscription broken (its slot gone or invalidated).
EXIT_BROKEN = 3


def say(*parts: str | tuple[str, str], err: bool = False) -> None:
    """Print one line: plain strings as they are, ``(text, style)`` pairs styled; never wrapped mid-line."""
    (err_console if err else console).print(Text.assemble(*parts), soft_wrap=True)


#: What ``rowfilter --help`` says first (plain text: argparse prints it as it is).
DESCRIPTION = """\
PostgreSQL logical replication (publications, row filters, column lists, per-table sync state) as
micro-batches on Spark. Every command reads one subscription spec file (--spec s1.yaml); passwords
come from PGPASSWORD, ROWFILTER_PUBLISHER_PASSWORD/ROWFILTER_SUBSCRIBER_PASSWORD or ~/.pgpass.

Run `rowfilter COMMAND --help` for a command's options and an example."""

#: name: (one line for the list of commands, what it does, an example). The examples are run by tests/test_cli.py.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "validate": ("check the publications and print each table's effective filters",
                 "Read the publications (from publications_ddl, else the publisher's catalog), check them with "
                 "PostgreSQL's rules and print, per table, the row filter of each operation, the initial copy's "
                 "filter and the column list. Exit 1 with PostgreSQL's message when a definition is invalid.",
                 "rowfilter validate --spec s1.yaml --format tsv"),
    "refresh": ("reconcile the tables with the publications (ALTER SUBSCRIPTION ... REFRESH PUBLICATION)",
                "Add newly published tables (state i, waiting for their copy), remove unpublished ones, and "
                "create the replication slot and the capture publication on the publisher when missing.",
                "rowfilter refresh --spec s1.yaml"),
    "status": ("per-table state, position and lag, the last batch and the slot; exit 3 when broken",
               "Print each table's state (like pg_subscription_rel), its LSN, how far it is behind the publisher "
               "now, what the last batch did to it and its last error; then the slot's WAL on the publisher. "
               "Exit 3 when the subscription is broken (its slot dropped or invalidated).",
               "rowfilter status --spec s1.yaml --format json"),
    "snapshot": ("copy the tables waiting for their initial copy (table sync)",
                 "Copy every table in state i or d (or the --table ones) with its filters, then record the "
                 "position its changes are applied from (state f).",
                 "rowfilter snapshot --spec s1.yaml --table public.orders"),
    "resync": ("empty a table and copy it again (backfill)",
               "Truncate the table in the subscriber and send it back to state i; --copy copies it right away.",
               "rowfilter resync --spec s1.yaml --table public.orders --copy"),
    "apply": ("drain the slot to the subscriber in micro-batches (the apply worker)",
              "Read the slot's changes into the change log and apply them to the subscriber in bounded batches, "
              "each in one transaction with every table's new position, until everything the publisher had "
              "committed when the run started is applied (or --time-budget is spent).",
              "rowfilter apply --spec s1.yaml --max-changes 50000 --time-budget 240"),
    "skip": ("skip the remote transaction finishing at an LSN once (ALTER SUBSCRIPTION ... SKIP)",
             "The next apply drops that one remote transaction (the LSN a conflict error names); --lsn NONE "
             "clears a pending skip.",
             "rowfilter skip --spec s1.yaml --lsn 0/14C0378"),
    "reset-conflicts": ("set the subscription's conflict counts back to zero (pg_stat_reset_subscription_stats)",
                        "The running counts of the conflicts the apply met (rowfilter.subscription_stats, per table in "
                        "rowfilter.conflict_stats, shown by status) start again from zero, and stats_reset says when; "
                        "the conflict log's rows stay.",
                        "rowfilter reset-conflicts --spec s1.yaml"),
    "disable": ("stop applying the subscription (ALTER SUBSCRIPTION ... DISABLE)",
                "The apply (the command, the operator, the incremental-sync DAG) applies nothing until the "
                "subscription is enabled again, and says so; the slot keeps the changes meanwhile (and the WAL "
                "they need). status and the Replication page show it disabled.",
                "rowfilter disable --spec s1.yaml"),
    "enable": ("apply the subscription again (ALTER SUBSCRIPTION ... ENABLE)",
               "The next apply goes on from where the subscription stopped.",
               "rowfilter enable --spec s1.yaml"),
    "sync-sequences": ("move the subscriber's sequences past the publisher's (before a switchover)",
                       "For each subscribed table, set every sequence one of its columns owns in the subscriber "
                       "past the value of the publisher's sequence of the same column (sequences are not "
                       "replicated). A sequence already past is left alone; --dry-run only says what it would set.",
                       "rowfilter sync-sequences --spec s1.yaml --table public.orders --dry-run"),
    "drop": ("drop the subscription (DROP SUBSCRIPTION): slot, capture publication, state",
             "Drop the slot and the capture publication on the publisher and the subscription's state in the "
             "subscriber; its tables and their data stay.",
             "rowfilter drop --spec s1.yaml"),
    "verify": ("compare each table with the publisher's rows under its filters (read-only); exit 1 when one differs",
               "Compare every table (or the --table ones) with the rows a new initial copy would bring: its "
               "publications' copy filter and column list, at one consistent point of both sides. Prints, per "
               "table, the rows compared and the rows missing, extra and different, with example keys. Changes "
               "no table; keeps each table's result for status.",
               "rowfilter verify --spec s1.yaml --table public.orders"),
    "reconcile": ("repair tables in place to what a new copy would hold, never emptying them",
                  "Bring every table (or the --table ones) to exactly what a new initial copy under the current "
                  "definitions would hold: missing rows inserted, extra ones deleted, different ones updated, range "
                  "by range; the table stays readable. --dry-run only says what would change.",
                  "rowfilter reconcile --spec s1.yaml --table public.orders --dry-run"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rowfilter", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {}
    for name, (summary, description, example) in COMMANDS.items():
        commands[name] = sub.add_parser(name, help=summary, description=textwrap.fill(description, 100),
                                        epilog=f"example:\n  {example}",
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
        commands[name].add_argument("--spec", required=True, help="subscription spec file (YAML)")
        commands[name].add_argument("--change-log-conn-id", metavar="CONN_ID",
                                    help="an Airflow aws, google_cloud_platform or wasb connection whose credentials "
                                    "reach the change log on object storage (default: the spec's change_log_conn_id, "
                                    "else this process's environment)")
    for name in ("validate", "status"):
        shape = commands[name].add_mutually_exclusive_group()
        shape.add_argument("--format", choices=FORMATS, default=None,
                           help="table (default on a terminal), tsv, or json; piped, the default is plain rows")
        shape.add_argument("--json", action="store_true", help="the same as --format json")
    commands["refresh"].add_argument("--recreate-slot", action="store_true", help="the slot was dropped: create a "
                                     "new one and send every table it had positioned back to state i, emptied, "
                                     "for a new copy")
    commands["refresh"].add_argument("--reconcile", action="store_true", help="reconcile in place instead of "
                                     "emptying: with --recreate-slot, the tables the lost slot had positioned; and "
                                     "every table whose copy filter or column list changed (the spec's reconcile: "
                                     "true does the same)")
    commands["resync"].add_argument("--reconcile", action="store_true", help="repair the table in place instead of "
                                    "emptying it (rowfilter reconcile): it stays readable")
    for name in ("verify", "reconcile"):
        commands[name].add_argument("--table", action="append", metavar="SCHEMA.TABLE",
                                    help=f"{name} only this table (repeatable); default every table")
        commands[name].add_argument("--max-readers", type=positive, default=None, metavar="N",
                                    help="most parallel readers of one side of one table (default 8)")
        commands[name].add_argument("--json", action="store_true", help="print the result as JSON")
    commands["reconcile"].add_argument("--dry-run", action="store_true",
                                       help="change nothing: verify and say what a reconcile would change")
    commands["snapshot"].add_argument("--table", action="append", metavar="SCHEMA.TABLE",
                                      help="copy only this table (repeatable); default every table in state i or d")
    commands["resync"].add_argument("--table", action="append", required=True, metavar="SCHEMA.TABLE",
                                    help="the table to copy again (repeatable)")
    commands["resync"].add_argument("--copy", action="store_true", help="copy it now instead of at the next snapshot")
    for name in ("snapshot", "resync"):
        commands[name].add_argument("--max-partitions", type=positive, default=None, metavar="N",
                                    help="most parallel readers per table (default: one, as PostgreSQL's table "
                                    "sync copies, straight into the table; several, up to twice Spark's default "
                                    "parallelism, where the planner says they pay: a large table whose filter "
                                    "keeps little of it and no index serves)")
        commands[name].add_argument("--progress-interval", type=interval, default=None, metavar="SECONDS",
                                    help="seconds between two reports of a copy's progress (default 1 on a "
                                    "terminal, where a bar shows them; else 10, one line each)")
    commands["apply"].add_argument("--max-changes", type=positive, default=None, metavar="N",
                                   help="bound of each batch in slot rows, at least 1 (whole transactions; "
                                   "default 100000)")
    commands["apply"].add_argument("--time-budget", type=seconds, default=None, metavar="SECONDS",
                                   help="start no further batch after this many seconds (a batch is never cut; "
                                   "0: one batch); default: no budget")
    commands["apply"].add_argument("--json", action="store_true", help="print the run's summary as JSON")
    commands["sync-sequences"].add_argument("--table", action="append", metavar="SCHEMA.TABLE",
                                            help="only this table (repeatable); default every subscribed table")
    commands["sync-sequences"].add_argument("--dry-run", action="store_true", help="say what would be set, set nothing")
    commands["sync-sequences"].add_argument("--json", action="store_true", help="print the result as JSON")
    commands["skip"].add_argument("--lsn", required=True,
                                  help="the finish LSN the conflict error names, e.g. 0/14C0378, or NONE")
    commands["drop"].add_argument("--keep-slot", action="store_true",
                                  help="drop the subscriber side only and leave the slot on the publisher, e.g. when "
                                  "it cannot be reached (ALTER SUBSCRIPTION ... SET (slot_name = NONE)); the slot "
                                  "retains WAL until dropped")
    server = sub.add_parser(
        "spark-server", help="start, stop or show the local Spark Connect server the specs' spark_remote can point at "
        "(127.0.0.1 only)", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "A Spark Connect server on this machine, listening on 127.0.0.1 only, that the jobs attach to as "
            "clients (a spec's spark_remote: sc://127.0.0.1:PORT, or an Airflow spark_connect connection): no JVM "
            "starts in the job or the task, and the runs of a subscription share its warm sessions. start returns "
            "once the server answers; stop ends it; status exits 3 when none runs.", 100),
        epilog="example:\n  rowfilter spark-server start --port 15002 --conf spark.driver.memory=4g\n"
               "  rowfilter spark-server status")
    server.add_argument("action", choices=("start", "stop", "status"),
                        help="start a server (or say which runs), stop it, or show it (exit 3: none runs)")
    server.add_argument("--state-dir", help="where its process id, log and token are kept (default "
                        "$ROWFILTER_SPARK_SERVER_DIR, else $XDG_STATE_HOME/rowfilter/spark-server); this user's jobs "
                        "find its token either way")
    server.add_argument("--port", type=positive, default=15002, help="its port on 127.0.0.1 (default 15002)")
    server.add_argument("--master", default="local[*]", help="its Spark master (default local[*])")
    server.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting of the server (repeatable), e.g. spark.driver.memory=4g")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rowfilter`` command; return the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger(PROGRESS_LOGGER).setLevel(logging.INFO)  # a long copy or drain says how far it is

    def spec_of(needs: Sequence[str] = ("publisher", "subscriber")) -> SubscriptionSpec:
        return load_spec(args.spec, needs, change_log_conn_id=args.change_log_conn_id)

    try:
        if args.command == "validate":
            return validate(spec_of(needs=("publisher",)),
                            fmt=output_format(args.format, console, as_json=args.json))
        if args.command == "refresh":
            return refresh(spec_of(), recreate_slot=args.recreate_slot, reconcile=args.reconcile or None)
        if args.command in ("verify", "reconcile") or (args.command == "resync" and args.reconcile):
            return compare(spec_of(), args)
        if args.command == "status":
            return status(spec_of(), fmt=output_format(args.format, console, as_json=args.json))
        if args.command in ("snapshot", "resync"):
            return sync_tables(spec_of(), args)
        if args.command == "apply":
            return apply_batch(spec_of(), max_changes=args.max_changes,
                               time_budget=args.time_budget, as_json=args.json)
        if args.command == "skip":
            return skip(spec_of(needs=("subscriber",)), args.lsn)
        if args.command == "sync-sequences":
            return sync_sequences(spec_of(), args)
        if args.command == "drop":
            return drop(spec_of(), keep_slot=args.keep_slot)
        if args.command == "reset-conflicts":
            return reset_conflicts(spec_of(needs=("subscriber",)))
        if args.command in ("disable", "enable"):
            return set_enabled(spec_of(needs=("subscriber",)), args.command == "enable")
        if args.command == "spark-server":
            return spark_server(args)
    except RowFilterError as e:
        say(("ERROR:", "bold red"), " ", str(e), err=True)
        return 1
    return 2


def load_spec(path: str, needs: Sequence[str] = ("publisher", "subscriber"),
              change_log_conn_id: str | None = None) -> SubscriptionSpec:
    """The spec file as the jobs need it: a file of the DAG factory, which names Airflow connections
    instead of URLs, is resolved through Airflow in a process of its own (hooks/spec_resolver.py: this
    command never imports Airflow); the passwords come back by pipe and go to this process's
    environment, where the jobs read them (connection.py ``PASSWORD_ENV``). Only when a role the command
    ``needs`` has a connection id and no URL: ``validate`` reads the publisher alone. The change log's
    store credentials likewise, from the Airflow connection ``change_log_conn_id`` (``--change-log-conn-id``,
    else the spec's) names: they replace the store's variables (``AWS_…``) in this process's environment."""
    spec = SubscriptionSpec.load(path)
    store = change_log_conn_id or spec.change_log_conn_id
    if change_log_conn_id:
        spec.check_change_log_conn_id(change_log_conn_id)
    named = [r for r in needs if getattr(spec, f"{r}_conn_id") and not getattr(spec, r)]
    named += [f"standbys ({s})" for s in spec.standbys if CONN_ID.match(s)]
    named += ["change_log_conn_id"] if store else []
    if not named:
        return spec
    import importlib.util
    import os
    import subprocess

    if importlib.util.find_spec("airflow") is None:
        raise SpecError(f"spec file {path!r} names Airflow connections "
                        f"({', '.join(r if r.startswith(('standbys', 'change_log')) else f'{r}_conn_id' for r in named)}), "
                        "and Airflow is not installed here",
                        hint="run the command where Airflow and its connections are, or give "
                        f"{' and '.join(named)} URLs in a spec file of their own")
    done = subprocess.run([sys.executable, "-m", "airflow_provider_rowfilter.hooks.spec_resolver", path,
                           *(["--change-log-conn-id", store] if store else [])],
                          capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    answer = json.loads(lines[-1]) if lines else {}
    if "spec" not in answer:  # its stderr is not shown: Airflow's own output may quote a connection
        raise SpecError(answer.get("error") or f"could not resolve the Airflow connections of {path!r} "
                        f"(exit status {done.returncode})", hint=answer.get("hint") or "run python -m "
                        f"airflow_provider_rowfilter.hooks.spec_resolver {path} to see Airflow's error")
    store_env = answer.get("store") or {}
    for key, value in answer["passwords"].items():
        if key not in store_env:
            os.environ.setdefault(key, value)
    os.environ.update(store_env)  # the connection named for the store wins over the environment's own credentials
    return SubscriptionSpec.from_json(answer["spec"])


def spark_server(args: argparse.Namespace) -> int:
    """``rowfilter spark-server start|stop|status``: the local Spark Connect server (spark/connect_server.py).

    ``status`` exits 3 when no server of this state directory runs.
    """
    from pathlib import Path

    from airflow_provider_rowfilter.core.errors import SpecError
    from airflow_provider_rowfilter.spark import connect_server

    state = Path(args.state_dir) if args.state_dir else None
    if args.action == "start":
        conf = {}
        for item in args.conf:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise SpecError(f"--conf {item!r} is not KEY=VALUE", hint="write --conf spark.driver.memory=4g")
            conf[key.strip()] = value
        info = connect_server.start(state, port=args.port, master=args.master, conf=conf)
        say(f"Spark Connect server running (pid {info.pid}): spark_remote: {info.url}  (log {info.log}; its token, "
            f"which this user's jobs read from there, in {info.token_file})")
        return 0
    if args.action == "stop":
        stopped = connect_server.stop(state)
        say(f"stopped the Spark Connect server (pid {stopped.pid})" if stopped else "no Spark Connect server was running")
        return 0
    running = connect_server.status(state)
    if running is None:
        say("no Spark Connect server is running")
        return EXIT_BROKEN
    info = running
    say(f"Spark Connect server running (pid {info.pid}): spark_remote: {info.url}  (log {info.log}; token in "
        f"{info.token_file})")
    return 0


def validate(spec: SubscriptionSpec, *, fmt: str | None = None) -> int:
    """Validate the spec's publications against the publisher and print the effective filters."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.core.schedule import longest_gap
    from airflow_provider_rowfilter.core.slot_retention import schedule_risks
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


#: How validate and status name each mode (core/spec.py ``filtering``).
FILTERING_LABELS = {"source": "source (the publisher's pgoutput)", "spark": "spark (the apply judges)"}


def refresh(spec: SubscriptionSpec, *, recreate_slot: bool = False, reconcile: bool | None = None) -> int:
    """Run the RefreshPublication job in-process and say what it added and removed."""
    from airflow_provider_rowfilter.jobs.refresh import refresh as run_refresh

    result = run_refresh(spec, recreate_slot=recreate_slot, reconcile=reconcile)
    # A table whose copy filter or column list changed: the job's own WARNING line says what and what to do.
    for check in result.reconciled:
        say(f"  reconciled {check['table']}: inserted {check['inserted']:,}, updated {check['updated']:,}, "
            f"deleted {check['deleted']:,}; state f at {check['lsn']}")
    if not result.changed:
        say(f"subscription {spec.subscription}: up to date ({len(result.tables)} tables, at {result.lsn})")
        return 0
    say(f"subscription {spec.subscription}: refreshed at {result.lsn}")
    for name in result.added:
        say("  ", (f"+ {name}", "green"), f"  ({'i: waiting for its initial copy' if spec.copy_data else 'r'})")
    for name in result.removed:
        say("  ", (f"- {name}", "red"), "  (no longer published; its progress is dropped)")
    if result.slot_created:
        say(f"  created replication slot rowfilter_{spec.subscription} (pgoutput{', failover' if result.failover else ''})"
            " on the publisher")
    if result.failover_switched:
        say(f"  replication slot rowfilter_{spec.subscription} is now {'' if result.failover else 'not '}a failover slot")
    if result.definitions_changed and not (result.added or result.removed):
        say("  definitions changed: they apply to changes after this position; rows already copied "
            "are not re-copied (as in PostgreSQL)")
    return 0


def compare(spec: SubscriptionSpec, args: argparse.Namespace) -> int:
    """``verify``, ``reconcile`` (or ``resync --reconcile``), in-process: each table's result, one paragraph each.

    ``verify`` exits 1 when a table differs; ``reconcile`` when a table could not be reconciled.
    """
    from airflow_provider_rowfilter.core.relation import TableName
    from airflow_provider_rowfilter.jobs.reconcile import reconcile
    from airflow_provider_rowfilter.jobs.verify import MAX_READERS, verify

    tables = [TableName.from_sql(t, "--table") for t in args.table] if args.table else None
    readers = getattr(args, "max_readers", None) or MAX_READERS
    if args.command == "verify":
        checked = verify(spec, tables, max_readers=readers)
        if args.json:
            print(json.dumps(checked.summary()))
        else:
            for t in checked.tables:
                say(t.describe(), err=not t.clean and t.checked)
        if not checked.clean:
            say(("DIFFERENT:", "bold red"), " ", str(checked.error(details=False)), err=True)  # printed above
            return 1
        return 0
    dry_run = bool(getattr(args, "dry_run", False))
    result = reconcile(spec, tables, max_readers=readers, dry_run=dry_run)
    if getattr(args, "json", False):
        print(json.dumps(result.summary()))
    else:
        for t in result.tables:
            if dry_run and t.checked:
                say(f"{t.table}: would insert {t.missing:,}, update {t.different:,}, delete {t.extra:,} "
                    f"(at {t.lsn}; {t.publisher_rows:,} publisher rows, {t.subscriber_rows:,} subscriber rows)")
            else:
                say(t.describe())
    if not result.ok:
        say(("ERROR:", "bold red"), " ", str(result.error()), err=True)
        return 1
    return 0


#: The columns of ``rowfilter status`` (a column is added here and in :func:`_status_row`).
STATUS_COLUMNS = (Column("table", whole=True), Column("filtering", whole=True, detail=True), Column("state", whole=True),
                  Column("lsn", whole=True), Column("behind now", whole=True),
                  Column("rows copied", whole=True, detail=True), Column("last batch", detail=True),
                  Column("last error", detail=True))


def status(spec: SubscriptionSpec, *, fmt: str | None = None) -> int:
    """Print the per-table sync state and the slot's WAL (``status --json``: docs/operations.md); ``fmt``
    None: a table on a terminal, plain rows elsewhere (cli_output.py).

    Returns 0, or :data:`EXIT_BROKEN` when the slot is gone while tables are past ``i``, or invalidated.
    """
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.publisher.slot_report import findings, publisher_view, readiness_lines, slot_line
    from airflow_provider_rowfilter.subscriber import conflicts
    from airflow_provider_rowfilter.subscriber.state import StateReader, relation_exists

    with connect(spec.subscriber, "subscriber", spec) as conn:
        reader = StateReader(conn, spec.subscription)
        subscription = reader.require_subscription()
        tables = reader.tables()
        last = reader.last_batch()
        checks = reader.checks()
        conflict_stats = conflicts.read(conn, spec.subscription) if relation_exists(conn, "conflict_stats") else None
        now = conn.execute("SELECT clock_timestamp()").fetchall()[0][0]  # the clock finished_at was written by
    view = publisher_view(spec, subscription.slot_name,
                          [(str(t.table), t.lsn) for t in tables if t.state.value == "f" and t.lsn])
    current, slot, unreachable, filtering = view.current, view.slot, view.unreachable, view.filtering
    warnings, broken = findings(spec, view, [str(t.table) for t in tables if t.state.value != "i"])
    fmt = fmt or output_format(None, console)
    lag = {}
    for t in tables:
        if current is not None and t.lsn is not None and t.state.value in "fsr":
            lag[t.table] = max(current - parse_lsn(t.lsn), 0)
    batch = None if last is None else {
        "id": last.id, "end_lsn": last.end_lsn, "lag_bytes": last.lag_bytes, "lag_seconds": last.lag_seconds,
        "finished_at": last.finished_at.isoformat(), "age_seconds": round((now - last.finished_at).total_seconds(), 3)}
    code = EXIT_BROKEN if broken else 0
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
            "warnings": warnings,
            "enabled": subscription.enabled,
            "applied_lsn": subscription.applied_lsn,
            "skip_lsn": subscription.skip_lsn,
            "last_error": subscription.last_error,
            "last_batch": batch,
            "conflicts": None if conflict_stats is None else conflict_stats.as_dict(),
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
        for line in readiness_lines(view):
            say(line)
        for parts in _check_lines(tables, checks, now):
            say(*parts)
        if conflict_stats is not None and any(conflict_stats.total.values()):
            say(("conflicts:", "yellow"), " ", _conflict_line(conflict_stats))
    if subscription.last_error:
        say(("last error:", "red"), " ", subscription.last_error, err=True)
    for text in warnings:
        say(("WARNING:", "yellow"), " ", text, err=True)
    if broken:
        say(("BROKEN:", "bold red"), " ", broken, err=True)
    return code


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


def apply_batch(spec: SubscriptionSpec, *, max_changes: int | None, time_budget: float | None = None,
                as_json: bool) -> int:
    """Run ApplyChanges in-process: batches until drained (or the budget is spent), each in one transaction."""
    from airflow_provider_rowfilter.apply.drain import apply
    from airflow_provider_rowfilter.core.apply_plan import DEFAULT_MAX_CHANGES

    bars = wants_bars(err_console)
    with progress_bars(bars):
        result = apply(_one_bar(spec, bars), max_changes=DEFAULT_MAX_CHANGES if max_changes is None else max_changes,
                       time_budget=time_budget)
    if as_json:
        print(json.dumps(result.summary()))
        return 0
    if result.disabled:
        say(f"subscription {spec.subscription}: ", ("disabled", "yellow"), ": nothing applied (`rowfilter enable` "
            "enables it)")
        return 0
    say(f"subscription {spec.subscription}: applied {result.changes:,} changes in {result.batches} "
        f"batch{'es' if result.batches != 1 else ''} through {result.end_lsn or '-'} in "
        f"{duration(result.duration_ms / 1000)}; {batch_lag(result.lag_bytes, result.lag_seconds)}")
    if result.budget_exhausted:
        say(f"  the time budget ({duration(time_budget or 0)}) stopped the run before {result.target_lsn}: the next "
            "run goes on from there")
    for name, counts in sorted(result.tables.items()):
        say(f"  {name}: {counts_text(counts)}")
    if result.skipped_lsn:
        say(f"  skipped the remote transaction finished at {result.skipped_lsn}")
    return 0


def _one_bar(spec: SubscriptionSpec, bars: bool) -> SubscriptionSpec:
    """With our bars on the terminal, Spark's own console progress bar (``[Stage 5:> (0 + 1) / 1]``, drawn by
    a Spark driver of this process) is turned off, unless the spec's spark_conf sets it. A Spark Connect
    server draws its own in its log: a client may not set it."""
    if not bars or spec.spark_remote or "spark.ui.showConsoleProgress" in spec.spark_conf:
        return spec
    return dataclasses.replace(spec, spark_conf={**spec.spark_conf, "spark.ui.showConsoleProgress": "false"})


def skip(spec: SubscriptionSpec, lsn: str) -> int:
    """``ALTER SUBSCRIPTION … SKIP (lsn = …)``: the next apply drops that one remote transaction."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.subscriber.state import StateStore

    with connect(spec.subscriber, "subscriber", spec) as conn:
        value = StateStore(conn, spec.subscription).skip_transaction(lsn)
    say(f"subscription {spec.subscription}: " + (
        f"the remote transaction finished at {value} will be skipped by the next apply" if value
        else "skip-LSN cleared"))
    return 0


def reset_conflicts(spec: SubscriptionSpec) -> int:
    """``pg_stat_reset_subscription_stats``: the subscription's conflict counts back to zero."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.subscriber import conflicts
    from airflow_provider_rowfilter.subscriber.state import StateStore, migrate

    with connect(spec.subscriber, "subscriber", spec) as conn:
        migrate(conn)
        StateStore(conn, spec.subscription).require_subscription()
        conflicts.reset(conn, spec.subscription)
    say(f"subscription {spec.subscription}: conflict counts reset to zero")
    return 0


def set_enabled(spec: SubscriptionSpec, enabled: bool) -> int:
    """``ALTER SUBSCRIPTION … ENABLE`` / ``DISABLE``."""
    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.subscriber.state import StateStore

    with connect(spec.subscriber, "subscriber", spec) as conn:
        was = StateStore(conn, spec.subscription).set_enabled(enabled)
    if was == enabled:
        say(f"subscription {spec.subscription}: already {'enabled' if enabled else 'disabled'}")
    elif enabled:
        say(f"subscription {spec.subscription}: enabled; the next apply goes on from where it stopped")
    else:
        say(f"subscription {spec.subscription}: disabled; the apply applies nothing until `rowfilter enable` (the "
            "slot keeps the changes, and the WAL they need, meanwhile)")
    return 0


def sync_sequences(spec: SubscriptionSpec, args: argparse.Namespace) -> int:
    """Run SyncSequences in-process and say, per sequence, what it set (or would)."""
    from airflow_provider_rowfilter.core.relation import TableName
    from airflow_provider_rowfilter.sequence_sync import sync_sequences as run_sync

    tables = [TableName.from_sql(t, "--table") for t in args.table] if args.table else None
    result = run_sync(spec, tables, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(result.summary()))
        if not result.ok:
            raise result.error()  # said on stderr by main, exit 1
        return 0
    if not result.sequences:
        say(f"subscription {spec.subscription}: no subscribed table owns a sequence on the publisher")
    for s in result.sequences:
        moved = f": next value {s.before} -> {s.after}" if s.action in ("set", "would set") else ""
        say(f"  {s.table}.{s.column}: {s.subscriber_sequence or '-'} {s.action}{moved} (publisher's "
            f"{s.publisher_sequence} at {'-' if s.publisher_last_value is None else s.publisher_last_value})")
    say(f"subscription {spec.subscription}: {result.changed} sequence{'' if result.changed == 1 else 's'} set"
        + (" (dry run: nothing was set)" if args.dry_run else ""))
    if not result.ok:
        raise result.error()  # said by main, exit 1
    return 0


def drop(spec: SubscriptionSpec, *, keep_slot: bool) -> int:
    """``DROP SUBSCRIPTION``: run the drop in-process and say what went; nothing left to drop is not an error."""
    from airflow_provider_rowfilter.subscription_drop import drop as run_drop

    result = run_drop(spec, keep_slot=keep_slot)
    if not result.dropped:
        say(f"subscription {spec.subscription}: nothing to drop")
    else:
        say(f"subscription {spec.subscription}: dropped")
    if result.slot_dropped:
        say("  ", (f"- replication slot {result.slot}", "red"), f" on the publisher{result.slot_note()}")
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


def sync_tables(spec: SubscriptionSpec, args: argparse.Namespace) -> int:
    """Run the SnapshotCopy job in-process (``snapshot``, or ``resync`` first); say what each table got."""
    from airflow_provider_rowfilter.core.relation import TableName
    from airflow_provider_rowfilter.jobs.snapshot import CopyOptions, sync_tables
    from airflow_provider_rowfilter.jobs.snapshot import resync as run_resync

    tables = [TableName.from_sql(t, "--table") for t in args.table] if args.table else None
    bars = wants_bars(err_console)
    every = args.progress_interval if args.progress_interval is not None else 1.0 if bars else None
    options = CopyOptions(max_partitions=args.max_partitions) if every is None else \
        CopyOptions(max_partitions=args.max_partitions, progress_interval=every)
    with progress_bars(bars):
        if args.command == "resync":
            result = run_resync(_one_bar(spec, bars), tables or [], copy=args.copy, options=options)
        else:
            result = sync_tables(_one_bar(spec, bars), tables, options=options)
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


if __name__ == "__main__":
    sys.exit(main())
