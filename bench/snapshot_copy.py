"""Initial copy of a filtered table: native table sync against our refresh + snapshot, in one run.

A table ``big (id bigint PK, region text, amount numeric(12,2), payload text)`` of ``--rows`` rows
(default 5,000,000) is published with a filter keeping half of them. It is copied
- natively: ``CREATE SUBSCRIPTION … copy_data`` into a second database, timed until every
  ``pg_subscription_rel`` row is ``r``;
- by us: ``refresh`` then ``snapshot`` into a third database, with a Spark session built beforehand
  (its start-up is reported apart, as native's server processes are already running).
Both targets are then compared whole (an md5 of every row in key order). Prints rows/s of both and
the ratio ours / native (design goal: >= 1.0). Not part of the test suite.

    python bench/snapshot_copy.py                    # 5M rows, a throwaway local PostgreSQL
    python bench/snapshot_copy.py --rows 100000      # smoke run
    python bench/snapshot_copy.py --identity full    # REPLICA IDENTITY FULL: no key, block ranges
    python bench/snapshot_copy.py --rows 8000000 --filter "region = 'NSW'" --repeat 3 --process connect
                                                     # 2M of 8M rows, `rowfilter snapshot` processes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec  # noqa: E402
from airflow_provider_rowfilter.flows.refresh import refresh  # noqa: E402
from airflow_provider_rowfilter.flows.table_sync.sync import CopyOptions, sync_tables  # noqa: E402
from airflow_provider_rowfilter.publisher.capture_objects import drop_capture_objects  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402

TABLE = "CREATE TABLE big (id bigint PRIMARY KEY, region text NOT NULL, amount numeric(12,2), payload text)"
FILTER = "region = 'NSW' OR region = 'VIC'"  # keeps half of the rows


def publisher_setup(dsn: str, rows: int, identity: str, row_filter: str = FILTER) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLE)
        conn.execute("""INSERT INTO big SELECT g, (ARRAY['NSW', 'VIC', 'QLD', 'WA'])[1 + g %% 4],
                               (g %% 100000) / 100.0, md5(g::text) || md5((g * 7)::text)
                        FROM generate_series(1, %s) g""", (rows,))
        conn.execute("VACUUM ANALYZE big")
        if identity == "full":
            # Every action published: the filter's column must be in the replica identity.
            conn.execute("ALTER TABLE big REPLICA IDENTITY FULL")
            conn.execute(f"CREATE PUBLICATION bench FOR TABLE big WHERE ({row_filter})")
        else:
            # The key stays the replica identity; a filter on region is valid for inserts only.
            conn.execute(f"CREATE PUBLICATION bench FOR TABLE big WHERE ({row_filter}) WITH (publish = 'insert')")


def create_database(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def admin_url(stack: contextlib.ExitStack, dsn: str | None) -> tuple[str, Callable[[str], str]]:
    """The administrator's URL (``--dsn``, or a throwaway embedded cluster entered on ``stack``) and the URL
    of a database of the same server, its parameters kept (``passfile``: a native subscription's walreceiver
    reads the password from it, not from this process's environment)."""
    if dsn:
        admin = dsn
    else:
        cluster = stack.enter_context(LocalPostgres.start())
        os.environ["PGPASSFILE"] = str(cluster.passfile)  # its superuser's password, for every database URL
        admin = cluster.dsn()
    base, _, query = admin.partition("?")
    return admin, lambda database: f"{base.rsplit('/', 1)[0]}/{database}" + (f"?{query}" if query else "")


def start_spark(master: str):
    """One Spark session for the benchmark and its start-up seconds (printed, not counted)."""
    from airflow_provider_rowfilter.spark.session import build_session

    began = time.monotonic()
    spark = build_session("rowfilter-bench", master=master,
                          conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    startup = time.monotonic() - began
    print(f"Spark {spark.version} on {spark.sparkContext.master}: session started in {startup:.1f} s "
          f"(not counted), {os.cpu_count()} CPUs")
    return spark, startup


def digest(dsn: str) -> tuple[int, str]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*), md5(string_agg(b::text, ',' ORDER BY id)) FROM big b").fetchone()


def native_copy(pub: str, target: str, name: str) -> float:
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute(TABLE)
        began = time.monotonic()
        conn.execute(sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION bench "
                             "WITH (create_slot = false, slot_name = {})").format(
            sql.Identifier(name), sql.Literal(pub), sql.Literal(name)))
        while True:
            states = [s for (s,) in conn.execute(
                "SELECT srsubstate FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid "
                "WHERE s.subname = %s", (name,))]
            if states and all(s == "r" for s in states):
                break
            time.sleep(0.02)
        seconds = time.monotonic() - began
        conn.execute(sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(name)))
    return seconds


def our_copy(pub: str, target: str, name: str, spark, options: CopyOptions) -> tuple[float, dict]:
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute(TABLE)
    spec = SubscriptionSpec(subscription=name, publisher=pub, subscriber=target, publications=("bench",))
    began = time.monotonic()
    refresh(spec)
    result = sync_tables(spec, spark=spark, options=options)
    seconds = time.monotonic() - began
    if not result.ok:
        raise SystemExit(f"our copy failed: {result.error()}")
    with psycopg.connect(pub, autocommit=True) as conn:
        drop_capture_objects(conn, name)
    return seconds, result.tables[0].__dict__


def our_copy_process(pub: str, target: str, name: str, workdir: Path, remote: str | None,
                     master: str, max_partitions: int | None = None) -> float:
    """``rowfilter refresh`` then a timed ``rowfilter snapshot`` process, as Airflow runs them (a process per run)."""
    from apply import write_spec
    from pgbench_common import cli

    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute(TABLE)
    spec = SubscriptionSpec(subscription=name, publisher=pub, subscriber=target, publications=("bench",),
                            change_log=str(workdir / name), spark_master=master,
                            spark_conf={} if remote else {"spark.ui.enabled": "false",
                                                          "spark.ui.showConsoleProgress": "false"},
                            spark_remote=remote)
    spec_file = write_spec(spec, workdir)
    cli(spec_file, "refresh")
    seconds = cli(spec_file, "snapshot", *(() if max_partitions is None else ("--max-partitions", str(max_partitions))))
    with psycopg.connect(pub, autocommit=True) as conn:
        drop_capture_objects(conn, name)
    return seconds


def compare_runs(admin: str, url: Callable[[str], str], pub: str, repeat: int,
                 ours: Callable[[str, str], tuple[float, str]]) -> tuple[list[float], list[float], int]:
    """``repeat`` runs, each a native copy then ours (``ours(target, name)`` -> seconds, what to print) into
    fresh databases, both targets compared whole; returns both kinds' times and the rows copied."""
    native_times: list[float] = []
    our_times: list[float] = []
    rows = 0
    for run in range(1, repeat + 1):
        create_database(admin, "bench_native")
        create_database(admin, "bench_ours")
        native_times.append(native_copy(pub, url("bench_native"), f"bench_native_{run}"))
        # One name for all runs (each copies into a fresh database, and its capture objects are dropped after
        # it): through Connect, the runs of a subscription's snapshot job attach to one server session, as
        # the per-table copies of an initial sync and the resyncs of a subscription do.
        seconds, said = ours(url("bench_ours"), "bench_ours")
        our_times.append(seconds)
        native_digest, our_digest = digest(url("bench_native")), digest(url("bench_ours"))
        if native_digest != our_digest:
            raise SystemExit(f"the copies differ: native {native_digest}, ours {our_digest}")
        rows = native_digest[0]
        print(f"run {run}: {rows:,} rows copied; native {native_times[-1]:.2f} s, {said}; targets identical",
              flush=True)
    return native_times, our_times, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5_000_000, help="rows in the published table (the default --filter copies half)")
    p.add_argument("--repeat", type=int, default=1, help="copies of each kind, alternating; medians reported")
    p.add_argument("--identity", choices=("key", "full"), default="key",
                   help="key: PK replica identity (integer key ranges); full: REPLICA IDENTITY FULL (block ranges)")
    p.add_argument("--dsn", help="admin URL of an existing PostgreSQL 15+ with wal_level=logical "
                   "(default: start a throwaway local one)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--max-partitions", type=int, help="readers per table (default: the job's own choice, one unless several pay)")
    p.add_argument("--filter", default=FILTER, help=f"the publication's row filter (default {FILTER!r}: half)")
    p.add_argument("--process", choices=("spark-submit", "connect"),
                   help="our copy as `rowfilter refresh` + a timed `rowfilter snapshot` process per run, as Airflow "
                   "runs it: with its own JVM (--master), or as a client of a local Spark Connect server "
                   "started once (warm after the first run); default: in this process, a warm session")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line too")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    with contextlib.ExitStack() as stack:
        admin, url = admin_url(stack, args.dsn)
        pub = url("bench_pub")
        create_database(admin, "bench_pub")
        began = time.monotonic()
        publisher_setup(pub, args.rows, args.identity, args.filter)
        print(f"publisher: {args.rows:,} rows loaded in {time.monotonic() - began:.1f} s; filter ({args.filter}); "
              f"identity {args.identity}")

        if args.process:
            return copy_processes(args, admin, url, pub, stack)
        spark, startup = start_spark(args.master)
        options = CopyOptions(max_partitions=args.max_partitions)

        copied: dict = {}

        def ours(target: str, name: str) -> tuple[float, str]:
            seconds, copied["table"] = our_copy(pub, target, name, spark, options)
            return seconds, f"ours {seconds:.2f} s ({copied['table']['partitions']} partitions)"

        native_times, our_times, rows = compare_runs(admin, url, pub, args.repeat, ours)
        spark.stop()

    native_s, our_s = statistics.median(native_times), statistics.median(our_times)
    native_rate, our_rate = rows / native_s, rows / our_s
    print(f"native table sync: {native_rate:,.0f} rows/s ({native_s:.2f} s)")
    print(f"rowfilter snapshot: {our_rate:,.0f} rows/s ({our_s:.2f} s)")
    print(f"ratio ours/native: {our_rate / native_rate:.2f}")
    if args.json:
        print(json.dumps({"rows_copied": rows, "native_seconds": native_s, "ours_seconds": our_s,
                          "native_rows_per_s": native_rate, "ours_rows_per_s": our_rate,
                          "ratio": our_rate / native_rate, "partitions": copied["table"]["partitions"],
                          "identity": args.identity, "spark_startup_seconds": startup}))
    return 0


def copy_processes(args, admin: str, url: Callable[[str], str], pub: str, stack: contextlib.ExitStack) -> int:
    """``--process``: native's table sync against ``rowfilter snapshot`` processes, medians of ``--repeat``."""
    from pgbench_common import spark_server

    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rowfilter-bench-copy-")))
    remote = stack.enter_context(spark_server(args.process == "connect", workdir))

    def ours(target: str, name: str) -> tuple[float, str]:
        seconds = our_copy_process(pub, target, name, workdir, remote, args.master, args.max_partitions)
        return seconds, f"`rowfilter snapshot` ({args.process}) {seconds:.2f} s"

    native_times, our_times, rows = compare_runs(admin, url, pub, args.repeat, ours)
    native_s, our_s = statistics.median(native_times), statistics.median(our_times)
    print(f"native table sync: {rows / native_s:,.0f} rows/s ({native_s:.2f} s)")
    print(f"rowfilter snapshot process ({args.process}): {rows / our_s:,.0f} rows/s ({our_s:.2f} s)")
    print(f"ratio ours/native: {native_s / our_s:.2f}")
    if args.json:
        print(json.dumps({"rows_copied": rows, "native_seconds": native_times, "ours_seconds": our_times,
                          "ratio": native_s / our_s, "process": args.process, "rows": args.rows,
                          "filter": args.filter, "max_partitions": args.max_partitions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
