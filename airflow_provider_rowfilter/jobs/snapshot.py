"""Table synchronization of a subscription's tables (PostgreSQL's tablesync worker): ``rowfilter snapshot``.

The table sync job: what spark-submit runs for SnapshotCopyOperator and ``python -m`` for a Spark Connect client
(the module keeps the command's name): the arguments, then one call of flows/table_sync/sync.py ``sync_tables``
(``resync`` with ``--resync``). Prints one JSON line: the result; non-zero on failure.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.flows.table_sync.sync import resync, sync_tables
from airflow_provider_rowfilter.flows.table_sync.table_copy import CopyOptions
from airflow_provider_rowfilter.jobs.arguments import parse, parser, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import fail, run_job
from airflow_provider_rowfilter.publisher.copy_source import DEFAULT_BLOCK_ROWS


def snapshot_parser():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--table", action="append", default=[], metavar="SCHEMA.TABLE",
                   help="copy this table (repeatable); default every table waiting for its copy")
    p.add_argument("--resync", action="store_true",
                   help="empty the named tables and copy them again (the backfill path)")
    p.add_argument("--max-partitions", type=int, help="most parallel readers per table (default: one, unless "
                   "the planner says several pay, then up to twice Spark's default parallelism; one reader "
                   "copies straight into the table)")
    p.add_argument("--fetch-size", type=int, default=DEFAULT_BLOCK_ROWS,
                   help="rows handed from the publisher's COPY to the subscriber's per write")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the result as JSON; non-zero on failure
    (exit status: jobs/exit_status.py)."""
    setup_logging()

    def body() -> int:
        args, spec = parse(snapshot_parser(), argv)
        tables = [TableName.from_sql(t, "--table") for t in args.table] or None
        options = CopyOptions(max_partitions=args.max_partitions, fetch_size=args.fetch_size)
        if args.resync:
            result = resync(spec, tables or [], copy=True, options=options)
        else:
            result = sync_tables(spec, tables, options=options)
        print(json.dumps(result.summary()))
        return 0 if result.ok else fail(result.error())

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
