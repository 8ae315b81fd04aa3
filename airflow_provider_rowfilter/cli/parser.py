"""The ``rowfilter`` command line: its commands, what each says in ``--help`` and the options it takes."""

from __future__ import annotations

import argparse
import textwrap

from airflow_provider_rowfilter import __version__
from airflow_provider_rowfilter.console.output import FORMATS
from airflow_provider_rowfilter.jobs.arguments import interval, positive, seconds

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
    "wait": ("wait until every table has applied past a publisher LSN (read-your-writes); exit 4 on --timeout",
             "Wait until every table of the subscription holds what the publisher had committed through --lsn (e.g. "
             "SELECT pg_current_wal_insert_lsn() right after your COMMIT), or at --at TIME: its position at or past "
             "the LSN, in state r (or s, or f: a copy consistent with a later snapshot). Exit 0 then; 1 when the "
             "subscription or a table records an error (waiting cannot fix it); 4 when --timeout runs out first.",
             "rowfilter wait --spec s1.yaml --lsn 0/1F00F48 --timeout 120"),
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


def build_parser() -> argparse.ArgumentParser:
    """The ``rowfilter`` command line: a subcommand per entry of :data:`COMMANDS`, and ``spark-server``."""
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
    commands["validate"].add_argument("--what-if", metavar="STATEMENT", help="an ALTER PUBLICATION … statement (or "
                                      "several, ;-separated): say how many rows of each table would enter and leave "
                                      "its initial-copy filter, judged by the publisher, without running it or "
                                      "writing anything")
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
                                   "default 100000 for the first batch, up to 400000 while a backlog waits)")
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
    target = commands["wait"].add_mutually_exclusive_group(required=True)
    target.add_argument("--lsn", help="the publisher LSN, e.g. 0/1F00F48")
    target.add_argument("--at", metavar="TIME", help="what the publisher had committed at this time (ISO 8601 with "
                        "its zone, or now): exact for a time not past yet (read when the publisher's clock reaches "
                        "it); for a past time, its position now, which holds everything committed by then")
    commands["wait"].add_argument("--timeout", type=seconds, default=300.0, metavar="SECONDS",
                                  help="give up after this many seconds, exit 4 (default 300)")
    commands["wait"].add_argument("--interval", type=interval, default=1.0, metavar="SECONDS",
                                  help="seconds between two readings of the subscriber (default 1)")
    commands["wait"].add_argument("--json", action="store_true", help="print where the tables stand as JSON")
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
