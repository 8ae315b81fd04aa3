"""A filter widened from 25 % to 50 % of a table: ``reconcile`` beside dropping and re-copying it natively, in one run.

The table of bench/snapshot_copy.py (``big``, ``--rows`` rows, default 5,000,000) is published with a filter
keeping a quarter of it (``region = 'NSW'``) and subscribed twice: by us (``refresh`` + ``snapshot``) and by a
native subscription. The filter is then widened to half (``region IN ('NSW', 'VIC')``). PostgreSQL re-copies
nothing; bringing the table to the new filter's rows natively means dropping the subscription, emptying the
table and subscribing again with ``copy_data``. Timed:

- native: ``DROP SUBSCRIPTION``, ``TRUNCATE``, ``CREATE SUBSCRIPTION … copy_data`` until the table is ``r``;
- ours: ``refresh`` (it names the changed filter) and ``reconcile`` until the table is ``f`` again.

A reader polls each table (``SELECT EXISTS (SELECT FROM big)``, every 20 ms) throughout: the seconds it found
it empty are reported (ours must be 0). Both tables are then compared whole. Not part of the test suite.

    python bench/reconcile.py                  # 5M rows, a throwaway local PostgreSQL
    python bench/reconcile.py --rows 200000    # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from snapshot_copy import TABLE, admin_url, create_database, digest, publisher_setup, start_spark  # noqa: E402

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec  # noqa: E402
from airflow_provider_rowfilter.flows.refresh import refresh  # noqa: E402
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables  # noqa: E402
from airflow_provider_rowfilter.flows.verify import comparison  # noqa: E402
from airflow_provider_rowfilter.flows.verify.reconcile import reconcile  # noqa: E402
from airflow_provider_rowfilter.tooling.native import NativeSubscription  # noqa: E402

QUARTER = "region = 'NSW'"
HALF = "region IN ('NSW', 'VIC')"


class EmptinessProbe:
    """A reader of ``dsn``'s ``big`` in a thread: the seconds it found the table empty, between start and stop."""

    def __init__(self, dsn: str, interval: float = 0.02) -> None:
        self.dsn, self.interval = dsn, interval
        self.empty_seconds, self.reads = 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            last, was_empty = time.monotonic(), False
            while not self._stop.is_set():
                empty = not conn.execute("SELECT EXISTS (SELECT FROM big)").fetchone()[0]
                now = time.monotonic()
                if was_empty:
                    self.empty_seconds += now - last
                last, was_empty = now, empty
                self.reads += 1
                time.sleep(self.interval)

    def __enter__(self) -> EmptinessProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def native_recopy(pub: str, target: str, native: NativeSubscription, name: str) -> float:
    """Drop the native subscription, empty its table, subscribe again with copy_data until ``r``: seconds."""
    began = time.monotonic()
    native.drop()
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("TRUNCATE big")
    NativeSubscription(pub, target, name, ("bench",)).create(timeout=3600)
    return time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5_000_000, help="rows in the published table")
    p.add_argument("--dsn", help="admin URL of an existing PostgreSQL 15+ with wal_level=logical")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--engine", choices=("job", "spark", "local"), default="job",
                   help="who runs the reads and the fixes: the job's own choice (default), always Spark tasks, always "
                   "the job's process")
    p.add_argument("--verbose", action="store_true", help="log each group's fix")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line too")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose:
        for name in ("airflow_provider_rowfilter.subscriber.reconcile_target", "airflow_provider_rowfilter.jobs"):
            logging.getLogger(name).setLevel(logging.DEBUG)
    if args.engine != "job":
        comparison.LOCAL_PAGES = 0 if args.engine == "spark" else 1 << 62
        comparison.LOCAL_ROWS = -1 if args.engine == "spark" else 1 << 62

    with contextlib.ExitStack() as stack:
        admin, url = admin_url(stack, args.dsn)
        pub, ours, theirs = url("bench_pub"), url("bench_ours"), url("bench_native")
        for name in ("bench_pub", "bench_ours", "bench_native"):
            create_database(admin, name)
        began = time.monotonic()
        publisher_setup(pub, args.rows, "key", QUARTER)
        print(f"publisher: {args.rows:,} rows loaded in {time.monotonic() - began:.1f} s; filter ({QUARTER})")
        spark, _ = start_spark(args.master)
        for dsn in (ours, theirs):
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(TABLE)
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rowfilter-bench-reconcile-")))
        spec = SubscriptionSpec(subscription="bench_reconcile", publisher=pub, subscriber=ours,
                                publications=("bench",), change_log=str(workdir / "changes"))
        refresh(spec)
        assert sync_tables(spec, spark=spark).ok
        native = NativeSubscription(pub, theirs, "bench_native_1", ("bench",)).create(timeout=3600)
        with psycopg.connect(ours, autocommit=True) as conn:
            quarter = conn.execute("SELECT count(*) FROM big").fetchone()[0]
        print(f"both subscribers hold the quarter: {quarter:,} rows")

        with psycopg.connect(pub, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER PUBLICATION bench SET TABLE big WHERE ({})").format(sql.SQL(HALF)))
        with EmptinessProbe(theirs) as native_probe:
            native_s = native_recopy(pub, theirs, native, "bench_native_2")
        print(f"native drop and re-copy: {native_s:.2f} s, the table empty for {native_probe.empty_seconds:.2f} s "
              f"({native_probe.reads} reads)", flush=True)
        with EmptinessProbe(ours) as our_probe:
            began = time.monotonic()
            refreshed = refresh(spec)
            result = reconcile(spec, spark=spark)
            our_s = time.monotonic() - began
        (check,) = result.tables
        print(f"refresh said: {refreshed.copy_definitions_changed['public.big'][:120]}…")
        print(f"rowfilter refresh + reconcile: {our_s:.2f} s (the reconcile {check.seconds:.2f} s: inserted "
              f"{check.inserted:,}, updated {check.updated:,}, deleted {check.deleted:,} in {check.differing_buckets:,} "
              f"of {check.buckets:,} ranges), the table empty for {our_probe.empty_seconds:.2f} s "
              f"({our_probe.reads} reads)")
        ours_digest, native_digest = digest(ours), digest(theirs)
        if ours_digest != native_digest:
            raise SystemExit(f"the tables differ: ours {ours_digest}, native {native_digest}")
        print(f"both tables hold the half: {ours_digest[0]:,} rows, identical")
        NativeSubscription(pub, theirs, "bench_native_2", ("bench",)).drop()
        spark.stop()

    print(f"ratio native/ours: {native_s / our_s:.2f}; seconds empty: native {native_probe.empty_seconds:.2f}, "
          f"ours {our_probe.empty_seconds:.2f}")
    if args.json:
        print(json.dumps({"rows": args.rows, "rows_after": ours_digest[0], "native_seconds": native_s,
                          "native_empty_seconds": native_probe.empty_seconds, "ours_seconds": our_s,
                          "reconcile_seconds": check.seconds, "ours_empty_seconds": our_probe.empty_seconds,
                          "inserted": check.inserted, "ratio": native_s / our_s, "engine": args.engine}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
