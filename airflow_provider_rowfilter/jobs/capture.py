"""Capture: move one bounded batch of the subscription's slot into a durable change-log segment.

The arguments, then one call of flows/capture.py ``capture_once``. Prints one JSON line: the LSN range, the
segment written (or null), transactions and changes, and the lag behind the publisher in bytes
(``pg_current_wal_lsn()`` minus the new slot position) and in seconds (now minus the commit time of the last
transaction captured).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from airflow_provider_rowfilter.change_log.segment_writer import DEFAULT_ROW_GROUP_ROWS
from airflow_provider_rowfilter.flows.capture import capture_once
from airflow_provider_rowfilter.jobs.arguments import parse, parser, positive, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import run_job
from airflow_provider_rowfilter.publisher.capture import DEFAULT_FETCH_ROWS, DEFAULT_MAX_CHANGES


def capture_parser() -> argparse.ArgumentParser:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--max-changes", type=positive, default=DEFAULT_MAX_CHANGES,
                   help="end the batch at the first commit after this many slot rows (PostgreSQL's "
                   f"upto_nchanges; whole transactions only; default {DEFAULT_MAX_CHANGES})")
    p.add_argument("--upto-lsn", help="end the batch at the first commit at or past this LSN (e.g. 0/1F00F48)")
    p.add_argument("--row-group-rows", type=positive, default=DEFAULT_ROW_GROUP_ROWS,
                   help=f"changes per Parquet row group, what the driver holds at once (default {DEFAULT_ROW_GROUP_ROWS})")
    p.add_argument("--fetch-rows", type=positive, default=DEFAULT_FETCH_ROWS,
                   help=f"slot rows per fetch from the server-side cursor (default {DEFAULT_FETCH_ROWS})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the capture summary as JSON (exit status:
    jobs/exit_status.py)."""
    setup_logging()

    def body() -> int:
        args, spec = parse(capture_parser(), argv)
        result = capture_once(spec, max_changes=args.max_changes, upto_lsn=args.upto_lsn,
                              row_group_rows=args.row_group_rows, fetch_rows=args.fetch_rows)
        print(json.dumps(result.summary()))
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
