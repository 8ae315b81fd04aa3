"""ApplyChanges: the slot drained to the subscriber in bounded batches, with PostgreSQL's row-filter semantics, exactly once.

The apply job: what spark-submit runs for ApplyChangesOperator and ``python -m`` for a Spark Connect client: the
arguments, then one call of flows/apply/drain.py ``apply``, which does the run (docs/apply.md). Prints one
JSON line: the run's summary (each batch is also kept in ``rowfilter.batch_history``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from airflow_provider_rowfilter.core.apply.plan import DEFAULT_MAX_CHANGES
from airflow_provider_rowfilter.flows.apply.capture_ahead import BACKLOG_MAX_CHANGES
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.jobs.arguments import parse, parser, positive, seconds, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import run_job


def apply_parser() -> argparse.ArgumentParser:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--max-changes", type=positive, default=None,
                   help=f"bound of each batch (slot rows captured, changes applied; whole transactions; "
                   f"default {DEFAULT_MAX_CHANGES} for the first, up to {BACKLOG_MAX_CHANGES} while a backlog waits)")
    p.add_argument("--time-budget", type=seconds, default=None, metavar="SECONDS",
                   help="start no further batch after this many seconds (a batch is never cut; 0: one batch); "
                   "default: drain everything committed before the run started")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the run's summary as JSON (exit status: jobs/exit_status.py)."""
    setup_logging()

    def body() -> int:
        args, spec = parse(apply_parser(), argv)
        result = apply(spec, max_changes=args.max_changes, time_budget=args.time_budget)
        print(json.dumps(result.summary()))
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
