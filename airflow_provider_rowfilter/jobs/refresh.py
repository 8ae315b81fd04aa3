"""RefreshPublication: reconcile a subscription with its publications (``ALTER SUBSCRIPTION … REFRESH PUBLICATION``).

The refresh job: what spark-submit runs for RefreshPublicationOperator and ``python -m`` for a Spark Connect
client: the arguments, then one call of flows/refresh.py ``refresh``. Prints one JSON line: the result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.jobs.arguments import parse, parser, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import run_job


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the result as JSON (exit status: jobs/exit_status.py)."""
    setup_logging()
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--recreate-slot", action="store_true",
                   help="the slot is gone: create a new one and send the tables it positioned back to i")
    p.add_argument("--reconcile", action="store_true",
                   help="repair in place (rowfilter reconcile) instead: the tables a lost slot positioned, and the "
                   "tables whose copy filter or column list changed (the spec's reconcile: true)")

    def body() -> int:
        args, spec = parse(p, argv)
        result = refresh(spec, recreate_slot=args.recreate_slot, reconcile=args.reconcile or None)
        print(json.dumps({**result.__dict__, "changed": result.changed}))
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
