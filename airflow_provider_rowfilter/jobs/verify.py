"""Verify: each table of a subscription compared with its publisher's rows at one consistent point (``rowfilter verify``).

The verify job: what spark-submit runs for VerifyTablesOperator and ``python -m`` for a Spark Connect client: the
arguments, then one call of flows/verify/verify.py ``verify``. Prints one JSON line: the result; 1 when a table differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.flows.verify.verify import LOCK_WAIT, MAX_READERS, verify
from airflow_provider_rowfilter.jobs.arguments import parse, parser, positive, seconds, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import fail, run_job


def verify_parser() -> argparse.ArgumentParser:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--table", action="append", default=[], metavar="SCHEMA.TABLE",
                   help="verify this table (repeatable); default every table of the subscription")
    p.add_argument("--max-readers", type=positive, default=MAX_READERS,
                   help=f"most parallel readers of one side of one table (default {MAX_READERS})")
    p.add_argument("--lock-wait", type=seconds, default=LOCK_WAIT, metavar="SECONDS",
                   help=f"how long to wait for a running apply to end (default {LOCK_WAIT:.0f})")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 when a table differs (the JSON says so)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the result as JSON; 1 when a table differs."""
    setup_logging()

    def body() -> int:
        args, spec = parse(verify_parser(), argv)
        tables = [TableName.from_sql(t, "--table") for t in args.table] or None
        result = verify(spec, tables, max_readers=args.max_readers, lock_wait=args.lock_wait)
        print(json.dumps(result.summary()))
        return 0 if result.clean or args.exit_zero else fail(result.error())

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
