"""SyncSequences as a job: ``python -m airflow_provider_rowfilter.jobs.sync_sequences --spec …``.

The arguments, then one call of flows/sync_sequences.py ``sync_sequences`` (what ``rowfilter sync-sequences`` and
SyncSequencesOperator run in process). Prints one JSON line: each sequence, its values before and after,
and what was done; exit 1 when a sequence could not be synchronized (the others were).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.flows.sync_sequences import sync_sequences
from airflow_provider_rowfilter.jobs.arguments import parse, parser, setup_logging
from airflow_provider_rowfilter.jobs.exit_status import run_job


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m``: prints the result as JSON (exit status: jobs/exit_status.py)."""
    setup_logging()
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--table", action="append", metavar="SCHEMA.TABLE", help="only this table (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="say what would be set, set nothing")

    def body() -> int:
        args, spec = parse(p, argv)
        tables = [TableName.from_sql(t, "--table") for t in args.table] if args.table else None
        result = sync_sequences(spec, tables, dry_run=args.dry_run)
        print(json.dumps(result.summary()))
        if not result.ok:
            raise result.error()  # exit 1, each sequence with its fix
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
