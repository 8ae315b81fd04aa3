"""Capture: move one bounded batch of the subscription's slot into a durable change-log segment.

Prints one JSON line: the LSN range, the segment written (or null), transactions and changes, and
the lag behind the publisher in bytes (``pg_current_wal_lsn()`` minus the new slot position) and in
seconds (now minus the commit time of the last transaction captured).

When the spec names a subscriber, what its tables still need of the log is read there first, and
the capture refuses, changing nothing, when the log misses any of it (publisher/capture.py ``_check_log``);
without one, the log may only not be behind the slot.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from airflow_provider_rowfilter.change_log.identity import LogNeeds
from airflow_provider_rowfilter.change_log.segment_writer import DEFAULT_ROW_GROUP_ROWS
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.jobs.arguments import parse, parser, positive, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import run_job
from airflow_provider_rowfilter.publisher.capture import (
    DEFAULT_FETCH_ROWS,
    DEFAULT_MAX_CHANGES,
    capture,
)
from airflow_provider_rowfilter.subscriber.state import StateStore


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
        result = capture(spec, max_changes=args.max_changes, upto_lsn=args.upto_lsn,
                         row_group_rows=args.row_group_rows, fetch_rows=args.fetch_rows,
                         needs=_subscriber_needs(spec) if spec.subscriber else None)
        print(json.dumps(result.summary()))
        return 0

    return run_job(body)


def _subscriber_needs(spec: SubscriptionSpec) -> LogNeeds:
    """What the spec's subscriber needs of the change log (its tables' positions, the log on record)."""
    with connect(spec.subscriber, "subscriber", spec) as sub:
        return StateStore(sub, spec.subscription).log_needs()


if __name__ == "__main__":
    sys.exit(main())
