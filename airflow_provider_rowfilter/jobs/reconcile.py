"""Reconcile: each table brought in place to what a new initial copy under the current definitions would hold.

The reconcile job: what spark-submit runs for ReconcileTablesOperator and ``python -m`` for a Spark Connect client:
the arguments, then one call of flows/verify/reconcile.py ``reconcile``. Prints one JSON line: the result;
non-zero when a table failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from airflow_provider_rowfilter.core.compare.table_compare import GROUP_ROWS
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.flows.verify.reconcile import reconcile
from airflow_provider_rowfilter.flows.verify.verify import LOCK_WAIT, MAX_READERS
from airflow_provider_rowfilter.jobs.arguments import parse, parser, positive, seconds, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import fail, run_job


def reconcile_parser() -> argparse.ArgumentParser:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--table", action="append", default=[], metavar="SCHEMA.TABLE",
                   help="reconcile this table (repeatable); default every table of the subscription")
    p.add_argument("--dry-run", action="store_true", help="change nothing: verify and say what would change")
    p.add_argument("--max-readers", type=positive, default=MAX_READERS,
                   help=f"most parallel readers of one side of one table (default {MAX_READERS})")
    p.add_argument("--lock-wait", type=seconds, default=LOCK_WAIT, metavar="SECONDS",
                   help=f"--dry-run: how long to wait for a running apply to end (default {LOCK_WAIT:.0f})")
    p.add_argument("--group-rows", type=positive, default=GROUP_ROWS, metavar="N",
                   help=f"about how many rows of differing key ranges one transaction fixes (default {GROUP_ROWS})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the result as JSON; non-zero when a table failed."""
    setup_logging()

    def body() -> int:
        args, spec = parse(reconcile_parser(), argv)
        tables = [TableName.from_sql(t, "--table") for t in args.table] or None
        result = reconcile(spec, tables, max_readers=args.max_readers, dry_run=args.dry_run, lock_wait=args.lock_wait,
                           group_rows=args.group_rows)
        print(json.dumps(result.summary()))
        return 0 if result.ok else fail(result.error())

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
