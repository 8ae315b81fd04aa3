"""The ``rowfilter`` console command: :func:`main` reads the command line (cli/parser.py) and runs one
command; each runs its job in process (cli/commands.py, cli/status.py, cli/filters.py) and prints what it
did (cli/console.py; tables and bars: console/)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from airflow_provider_rowfilter.cli.commands import (
    apply_batch,
    compare,
    drop,
    refresh,
    reset_conflicts,
    set_enabled,
    skip,
    spark_server,
    sync_sequences,
    sync_tables,
)
from airflow_provider_rowfilter.cli.console import EXIT_BROKEN, console, err_console, say
from airflow_provider_rowfilter.cli.filters import print_filters, validate
from airflow_provider_rowfilter.cli.parser import COMMANDS, build_parser
from airflow_provider_rowfilter.cli.spec_file import load_spec
from airflow_provider_rowfilter.cli.status import STATUS_COLUMNS, status
from airflow_provider_rowfilter.cli.wait import wait
from airflow_provider_rowfilter.console.output import output_format
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.humane import PROGRESS_LOGGER

__all__ = ["COMMANDS", "EXIT_BROKEN", "STATUS_COLUMNS", "console", "err_console", "load_spec", "main",
           "print_filters", "say", "status"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rowfilter`` command; return the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger(PROGRESS_LOGGER).setLevel(logging.INFO)  # a long copy or drain says how far it is

    def spec_of(needs: Sequence[str] = ("publisher", "subscriber")) -> SubscriptionSpec:
        return load_spec(args.spec, needs, change_log_conn_id=args.change_log_conn_id)

    try:
        if args.command == "validate":
            return validate(spec_of(needs=("publisher",)),
                            fmt=output_format(args.format, console, as_json=args.json), what_if=args.what_if)
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
        if args.command == "wait":
            return wait(spec_of(needs=("subscriber",) if args.lsn else ("publisher", "subscriber")), lsn=args.lsn,
                        at=args.at, timeout=args.timeout, interval=args.interval, as_json=args.json)
        if args.command == "spark-server":
            return spark_server(args)
    except RowFilterError as e:
        say(("ERROR:", "bold red"), " ", str(e), err=True)
        return 1
    return 2
