"""``python -m airflow_provider_rowfilter.tooling.demo``: the demo on a throwaway local PostgreSQL (scripts/demo.sh)."""

from __future__ import annotations

import argparse
import sys

from airflow_provider_rowfilter.tooling.demo.run import INCREMENTAL_BATCHES, run_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_rowfilter.tooling.demo",
                                     description="run the demo on a throwaway local PostgreSQL")
    parser.add_argument("--keep", metavar="DIR", help="keep the demo's PostgreSQL and files in DIR")
    parser.add_argument("--batches", type=int, default=INCREMENTAL_BATCHES, metavar="N",
                        help="incremental-sync DAG runs after the initial sync, each after a round of live changes")
    parser.add_argument("--spark-connect", action="store_true",
                        help="run the jobs as Spark Connect clients of a local server started for the demo "
                        "(rowfilter spark-server) instead of through spark-submit")
    args = parser.parse_args(argv)
    return run_demo(keep=args.keep, batches=args.batches, spark_connect=args.spark_connect)


if __name__ == "__main__":
    sys.exit(main())
