"""Keeping up with a busy publisher: pgbench at full speed while `rowfilter apply` runs every minute.

Two throwaway clusters (tooling/embedded.py), as a real deployment has two servers: the publisher,
filled by ``pgbench -i -s --scale`` and published as in bench/drain.py (row filters on accounts,
tellers and the keyless, insert-only history), and the subscriber, our copy done and caught up.
Then, for ``--seconds`` (default 600), pgbench writes unthrottled (``-c --clients -j --threads``;
``--rate`` throttles it to that many transactions/s) while the incremental sync runs as the shipped
DAG would with ``schedule=--interval`` seconds, ``max_active_runs=1`` and no catch-up: one
``rowfilter apply --spec … --json`` process started at each tick; a run that overruns its tick is
followed at once by the next, missed ticks are not made up. No run starts after pgbench stopped.
At the end of each run:
- lag bytes: the publisher's ``pg_current_wal_lsn()`` minus our slot's ``confirmed_flush_lsn``;
- lag seconds: how far the subscriber is behind the publisher's last commit: the publisher's clock
  (now while pgbench writes, its end after) minus the newest ``mtime`` in the subscriber's
  ``pgbench_history`` (pgbench stamps each transaction's row with its start, ``CURRENT_TIMESTAMP``);
  also the run's own summary ``lag_seconds`` (at the end of its capture);
and whether the lag stays under two intervals. Then (unless ``--no-compare``) runs back to back drain
what is left and every published table is compared with the publisher's rows through the same filter. The result goes to
``--out`` as JSON; ``python bench/chart.py --keepup <json>`` draws it. Not part of the test suite.

    python bench/keepup.py                             # 10 minutes (about 13 with the set-up)
    python bench/keepup.py --seconds 120 --scale 1     # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import (  # noqa: E402  (bench/apply.py: the shared helpers; puts this checkout on the path)
    CLI,
    create_database,
    current_lsn,
    drain_processes,
    load_average,
    run_job,
    slot_behind,
)
from pgbench_common import (  # noqa: E402  (the pgbench scenario, shared with bench/drain.py)
    ACCOUNTS_FILTER,
    HISTORY_FILTER,
    PGBENCH,
    TELLERS_FILTER,
    apply_arguments,
    apply_flags,
    parse,
    pgbench_arguments,
    pgbench_env,
    pgbench_figures,
    publisher_setup,
    server_version,
    setup_ours,
    spark_server,
    subscriber_setup,
)

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402

FILTERS = {"pgbench_accounts": ACCOUNTS_FILTER, "pgbench_tellers": TELLERS_FILTER, "pgbench_branches": "true",
           "pgbench_history": HISTORY_FILTER}


def last_applied_epoch(sub: str) -> float | None:
    """Epoch of the newest pgbench_history row in the subscriber (pgbench stamps it in UTC: PGTZ)."""
    with psycopg.connect(sub, autocommit=True) as conn:
        value = conn.execute("SELECT extract(epoch FROM max(mtime) AT TIME ZONE 'UTC') FROM pgbench_history").fetchone()[0]
    return None if value is None else float(value)


def filtered_rows(dsn: str, table: str, where: str) -> list[str]:
    """Every row of ``table`` passing ``where``, in its text form, sorted (as tooling/native.table_rows)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT x::text FROM {} x WHERE {}").format(
            sql.Identifier(table), sql.SQL(where))).fetchall()
    return sorted(r[0] for r in rows)


def compare_with_publisher(pub: str, sub: str) -> dict[str, int]:
    rows = {}
    for table, where in FILTERS.items():
        theirs, ours = filtered_rows(pub, table, where), filtered_rows(sub, table, "true")
        if theirs != ours:
            raise SystemExit(f"{table} differs: publisher {len(theirs):,} rows through ({where}), ours {len(ours):,}")
        rows[table] = len(ours)
    return rows


def scheduled_runs(spec_file: Path, pub: str, sub: str, slot: str, interval: float, seconds: float,
                   began: float, writing_until: float, extra: list[str]) -> list[dict]:
    """One ``rowfilter apply`` process per tick, as a DAG with max_active_runs=1 and catchup=False runs it.

    ``began``: the monotonic clock at pgbench's start; ``writing_until``: the wall clock of its end.
    """
    runs: list[dict] = []
    tick = 0
    while tick * interval < seconds:
        start_at = began + tick * interval
        if (wait := start_at - time.monotonic()) > 0:
            time.sleep(wait)
        started = time.monotonic()
        job = run_job([CLI, "apply", "--spec", str(spec_file), "--json", *extra], spec_file.parent)
        ended = time.monotonic()
        s = job["summary"]
        lag_bytes = slot_behind(pub, slot)
        applied = last_applied_epoch(sub)
        now = time.time()
        writing = now < writing_until
        publisher_clock = min(now, writing_until)  # the publisher's last commit: now, or pgbench's end
        lag_seconds = None if applied is None else max(publisher_clock - applied, 0.0)
        run = {"tick": tick, "start": started - began, "end": ended - began, "wall": job["wall"],
               "late": started - start_at, "lag_bytes": lag_bytes, "lag_seconds": lag_seconds,
               "under_two_intervals": lag_seconds is not None and lag_seconds < 2 * interval,
               "publisher_writing": writing, "changes": s.get("changes", 0), "transactions": s.get("transactions", 0),
               "batches": s.get("batches", 1), "drained": s.get("drained"),
               "budget_exhausted": s.get("budget_exhausted"), "summary_lag_seconds": s.get("lag_seconds"),
               "summary_lag_bytes": s.get("lag_bytes"), "peak_kb_by_process": job["peak_kb_by_process"]}
        runs.append(run)
        print(f"  run {len(runs)} (tick {tick}, {run['late']:+.1f} s): {run['wall']:.1f} s, {run['changes']:,} changes "
              f"in {run['batches']} batch(es); lag {lag_bytes / 2**20:,.1f} MiB, "
              + (f"{lag_seconds:.1f} s" if lag_seconds is not None else "- s") + f"; load average {load_average()}",
              flush=True)
        # The next tick after this run's end; a tick passed during the run starts a run now (one, not each).
        tick = max(tick + 1, math.floor((time.monotonic() - began) / interval))
    return runs


def run(args, pub_cluster: LocalPostgres, sub_cluster: LocalPostgres, workdir: Path,
        remote: str | None = None) -> dict:
    create_database(pub_cluster.dsn(), "bench_pub")
    create_database(sub_cluster.dsn(), "bench_ours")
    pub, sub = pub_cluster.dsn("bench_pub"), sub_cluster.dsn("bench_ours")
    init_s = publisher_setup(pub_cluster, "bench_pub", args.scale)
    subscriber_setup(sub_cluster, "bench_ours")
    spec_file, slot, copy_s = setup_ours(pub, sub, "bench_keepup", workdir, args.conf, remote)
    print(f"publisher: pgbench -i -s {args.scale} in {init_s:.1f} s; our copy and catch-up {copy_s:.1f} s",
          flush=True)

    bench_args = ["-n", "-P", "10", "-c", str(args.clients), "-j", str(args.threads), "-T", str(args.seconds),
                  *(["-R", str(args.rate)] if args.rate else [])]
    extra = apply_flags(args)
    out = workdir / "pgbench.out"
    with out.open("w") as sink:
        began, began_epoch = time.monotonic(), time.time()
        proc = subprocess.Popen([PGBENCH, *bench_args], env=pgbench_env(pub_cluster, "bench_pub"), stdout=sink,
                                stderr=subprocess.STDOUT, text=True)
        try:
            runs = scheduled_runs(spec_file, pub, sub, slot, args.interval, args.seconds, began,
                                  began_epoch + args.seconds, extra)
        finally:
            if proc.wait(timeout=args.seconds + 120):
                raise SystemExit(f"pgbench failed ({proc.returncode}):\n{out.read_text()[-4000:]}")
    bench = pgbench_figures(out.read_text())
    print(f"pgbench {' '.join(bench_args)}: {bench['transactions']:,} transactions, {bench['tps']:,.0f} tps", flush=True)

    final, rows = [], None
    if args.compare:
        final = drain_processes(spec_file, pub, slot, current_lsn(pub))
        rows = compare_with_publisher(pub, sub)
        print(f"after {len(final)} more runs ({sum(r['wall'] for r in final):.0f} s), the subscriber equals the "
              "publisher through the filters: " + ", ".join(f"{t} {n:,} rows" for t, n in rows.items()), flush=True)
    lags = [r["lag_seconds"] for r in runs if r["lag_seconds"] is not None]
    return {"scale": args.scale, "clients": args.clients, "threads": args.threads, "rate": args.rate,
            "seconds": args.seconds, "interval": args.interval, "max_changes": args.max_changes,
            "time_budget": args.time_budget, "spark_conf": args.conf, "spark_connect": bool(remote),
            "pgbench_transactions": bench["transactions"], "pgbench_tps": bench["tps"],
            "pgbench_progress": bench["progress"], "runs": runs,
            "max_lag_seconds": max(lags, default=None), "max_lag_bytes": max((r["lag_bytes"] for r in runs), default=None),
            "under_two_intervals": all(r["under_two_intervals"] for r in runs),
            "final_runs": len(final), "final_seconds": sum(r["wall"] for r in final),
            "tables_equal": True if rows is not None else "not compared", "table_rows": rows,
            "cpus": os.cpu_count(), "postgres": server_version(pub_cluster),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pgbench_arguments(p)
    p.add_argument("--rate", type=float, help="pgbench -R: transactions/s (default: unthrottled, the fastest)")
    p.add_argument("--seconds", type=int, default=600, help="how long pgbench writes (default 600)")
    p.add_argument("--interval", type=float, default=60, help="the DAG's schedule in seconds (default 60)")
    p.add_argument("--no-compare", dest="compare", action="store_false",
                   help="skip the last drain and the comparison (a backlog left behind can take long to drain)")
    apply_arguments(p, "keepup.json")
    args = parse(p, argv)

    with contextlib.ExitStack() as stack:
        pub_cluster = stack.enter_context(LocalPostgres.start())
        sub_cluster = stack.enter_context(LocalPostgres.start())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rowfilter-bench-keepup-")))
        print(f"PostgreSQL {server_version(pub_cluster)} (publisher and subscriber clusters); {os.cpu_count()} CPUs; "
              f"load average {load_average()}", flush=True)
        f = run(args, pub_cluster, sub_cluster, workdir,
                stack.enter_context(spark_server(args.spark_connect, workdir)))

    args.out.write_text(json.dumps(f, indent=1) + "\n")
    print()
    print(f"{'run':>4}{'start s':>9}{'wall s':>8}{'changes':>10}{'lag MiB':>9}{'lag s':>8}")
    for i, r in enumerate(f["runs"], 1):
        lag = "-" if r["lag_seconds"] is None else f"{r['lag_seconds']:.1f}"
        print(f"{i:>4}{r['start']:>9.1f}{r['wall']:>8.1f}{r['changes']:>10,}{r['lag_bytes'] / 2**20:>9.1f}{lag:>8}")
    print(f"pgbench {f['pgbench_tps']:,.0f} tps; lag under two intervals ({2 * f['interval']:.0f} s) after every run: "
          f"{'yes' if f['under_two_intervals'] else 'NO'}"
          + ("; tables equal to the publisher's through the filters" if f["table_rows"] else "; tables not compared"))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
