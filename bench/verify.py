"""Verify of a filtered table against its publisher, beside a native full re-copy of it, in one run.

The table of bench/snapshot_copy.py (``big``, ``--rows`` rows, default 5,000,000; its filter keeps half)
is copied into our subscriber (``refresh`` + ``snapshot``, not timed). Then, alternating ``--repeat`` times:

- native: a full re-copy of the table, as a user would get one (``CREATE SUBSCRIPTION … copy_data`` into a
  fresh database, timed until its ``pg_subscription_rel`` row is ``r``);
- ours: ``verify`` of the table (both sides hashed per key range in the databases, read by Spark tasks of
  a session built beforehand; its start-up is reported apart, as native's server processes already run).

Prints both times and the ratio (native seconds / ours: above 1, the verify takes less than a re-copy).
Then plants a difference (one row changed, one missing, one extra) and checks that the verify finds exactly it.
Not part of the test suite.

    python bench/verify.py                  # 5M rows, a throwaway local PostgreSQL
    python bench/verify.py --rows 200000    # smoke run
    python bench/verify.py --engine local   # the job's own threads instead of Spark tasks
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from snapshot_copy import (  # noqa: E402
    FILTER,
    TABLE,
    admin_url,
    create_database,
    native_copy,
    publisher_setup,
    start_spark,
)

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec  # noqa: E402
from airflow_provider_rowfilter.flows.refresh import refresh  # noqa: E402
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables  # noqa: E402
from airflow_provider_rowfilter.flows.verify import comparison  # noqa: E402
from airflow_provider_rowfilter.flows.verify.verify import verify  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5_000_000, help="rows in the published table (the filter keeps half)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each kind, alternating; medians reported")
    p.add_argument("--dsn", help="admin URL of an existing PostgreSQL 15+ with wal_level=logical")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--engine", choices=("job", "spark", "local"), default="job",
                   help="who runs the reads: the job's own choice (default), always Spark tasks, always the job's threads")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line too")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.engine != "job":
        comparison.LOCAL_PAGES = 0 if args.engine == "spark" else 1 << 62

    with contextlib.ExitStack() as stack:
        admin, url = admin_url(stack, args.dsn)
        pub, ours = url("bench_pub"), url("bench_ours")
        for name in ("bench_pub", "bench_ours"):
            create_database(admin, name)
        began = time.monotonic()
        publisher_setup(pub, args.rows, "key")
        print(f"publisher: {args.rows:,} rows loaded in {time.monotonic() - began:.1f} s; filter ({FILTER})")
        spark, _ = start_spark(args.master)
        with psycopg.connect(ours, autocommit=True) as conn:
            conn.execute(TABLE)
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rowfilter-bench-verify-")))
        spec = SubscriptionSpec(subscription="bench_verify", publisher=pub, subscriber=ours, publications=("bench",),
                                change_log=str(workdir / "changes"))
        began = time.monotonic()
        refresh(spec)
        copied = sync_tables(spec, spark=spark)
        print(f"ours: {copied.tables[0].rows_copied:,} rows copied in {time.monotonic() - began:.1f} s (not counted)")

        native_times, our_times, checks = [], [], []
        for run in range(1, args.repeat + 1):
            create_database(admin, "bench_native")
            native_times.append(native_copy(pub, url("bench_native"), f"bench_native_{run}"))
            began = time.monotonic()
            result = verify(spec, spark=spark)
            our_times.append(time.monotonic() - began)
            (check,) = result.tables
            if not check.clean:
                raise SystemExit(f"the verify found differences in equal tables: {check.describe()}")
            checks.append(check)
            print(f"run {run}: native re-copy {native_times[-1]:.2f} s; verify {our_times[-1]:.2f} s "
                  f"({check.rows:,} rows compared in {check.buckets:,} ranges, equal)", flush=True)

        with psycopg.connect(ours, autocommit=True) as conn:
            changed, missing = conn.execute("SELECT min(id), max(id) FROM big").fetchone()
            conn.execute("UPDATE big SET amount = amount + 1 WHERE id = %s", (changed,))
            conn.execute("DELETE FROM big WHERE id = %s", (missing,))
            conn.execute("INSERT INTO big VALUES (%s, 'QLD', 0, 'extra')", (args.rows + 1,))
        began = time.monotonic()
        (planted,) = verify(spec, spark=spark).tables
        planted_seconds = time.monotonic() - began
        if (planted.missing, planted.extra, planted.different) != (1, 1, 1):
            raise SystemExit(f"the planted difference was not found exactly: {planted.describe()}")
        print(f"planted difference found in {planted_seconds:.2f} s: {planted.examples}")
        spark.stop()

    native_s, our_s = statistics.median(native_times), statistics.median(our_times)
    rows = checks[0].publisher_rows
    print(f"native full re-copy: {native_s:.2f} s ({rows / native_s:,.0f} rows/s)")
    print(f"rowfilter verify:    {our_s:.2f} s ({checks[0].rows / our_s:,.0f} rows compared/s)")
    print(f"ratio native/verify: {native_s / our_s:.2f}")
    if args.json:
        print(json.dumps({"rows": args.rows, "published_rows": rows, "native_seconds": native_times,
                          "verify_seconds": our_times, "ratio": native_s / our_s, "engine": args.engine,
                          "buckets": checks[0].buckets, "planted_seconds": planted_seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
