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

Beside ours, under the same pgbench: a native subscription (database ``bench_native`` of the
subscriber cluster) and, with ``--pglogical``, a pglogical 2 subscription (``bench_pglogical``;
bench/pglogical_peer.py; both clusters then run Debian's PostgreSQL 15 with pglogical preloaded).
Both stay enabled; a sampler reads the lag of all three every ``--sample`` seconds (bytes: the
publisher's WAL past each slot's ``confirmed_flush_lsn``; seconds: as above, each subscriber's own
``pgbench_history``).

``--fractions 0.5,0.75,1`` runs one phase per fraction of the machine's rate on the same clusters:
first pgbench unthrottled for ``--calibrate`` seconds with the subscriptions running measures the
rate, then each phase runs pgbench at that fraction (``-R``) for ``--seconds``, and waits for the
three to catch up before the next.

    python bench/keepup.py                             # 10 minutes (about 13 with the set-up)
    python bench/keepup.py --seconds 120 --scale 1     # smoke run
    python bench/keepup.py --pglogical --fractions 0.5,0.75,1   # the three side by side, three phases
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
import threading
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
    PUBLICATIONS,
    TELLERS_FILTER,
    apply_arguments,
    apply_flags,
    decoder,
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
from pglogical_peer import DEFAULT_BIN_DIR, PglogicalSubscription, remove, start_cluster  # noqa: E402

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402
from airflow_provider_rowfilter.tooling.native import NativeSubscription  # noqa: E402

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


class Sampler:
    """The lag of every subscription every ``period`` seconds, in a thread, while pgbench writes."""

    def __init__(self, pub: str, peers: dict[str, tuple[str, str]], began: float, writing_until: float,
                 period: float) -> None:
        self.pub, self.peers, self.began, self.writing_until, self.period = pub, peers, began, writing_until, period
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            sample = {"t": time.monotonic() - self.began}
            publisher_clock = min(time.time(), self.writing_until)
            for name, (slot, sub) in self.peers.items():
                applied = last_applied_epoch(sub)
                sample[f"{name}_bytes"] = slot_behind(self.pub, slot)
                sample[f"{name}_seconds"] = None if applied is None else max(publisher_clock - applied, 0.0)
            self.samples.append(sample)


def wait_caught_up(pub: str, slots: list[str], timeout: float) -> float:
    """Seconds until every slot in ``slots`` confirmed the publisher's position now (``timeout`` at most)."""
    target, began = current_lsn(pub), time.monotonic()
    while any(slot_behind(pub, slot, target) > 0 for slot in slots):
        if time.monotonic() - began > timeout:
            break
        time.sleep(0.2)
    return time.monotonic() - began


def run_pgbench(pub_cluster: LocalPostgres, args, seconds: int, rate: float | None, workdir: Path,
                during) -> tuple[dict, list[str], object]:
    """pgbench for ``seconds`` (``-R rate`` when given) while ``during(began, writing_until)`` runs."""
    bench_args = ["-n", "-P", "10", "-c", str(args.clients), "-j", str(args.threads), "-T", str(seconds),
                  *(["-R", f"{rate:.0f}"] if rate else [])]
    out = workdir / "pgbench.out"
    with out.open("w") as sink:
        began, began_epoch = time.monotonic(), time.time()
        proc = subprocess.Popen([PGBENCH, *bench_args], env=pgbench_env(pub_cluster, "bench_pub"), stdout=sink,
                                stderr=subprocess.STDOUT, text=True)
        try:
            result = during(began, began_epoch + seconds)
        finally:
            if proc.wait(timeout=seconds + 120):
                raise SystemExit(f"pgbench failed ({proc.returncode}):\n{out.read_text()[-4000:]}")
    return pgbench_figures(out.read_text()), bench_args, result


def run(args, pub_cluster: LocalPostgres, sub_cluster: LocalPostgres, workdir: Path,
        remote: str | None = None) -> dict:
    create_database(pub_cluster.dsn(), "bench_pub")
    subscribers = ["bench_ours", "bench_native", *(["bench_pglogical"] if args.pglogical else [])]
    for name in subscribers:
        create_database(sub_cluster.dsn(), name)
    pub, sub = pub_cluster.dsn("bench_pub"), sub_cluster.dsn("bench_ours")
    init_s = publisher_setup(pub_cluster, "bench_pub", args.scale)
    for name in subscribers:
        subscriber_setup(sub_cluster, name)
    spec_file, slot, copy_s = setup_ours(pub, sub, "bench_keepup", workdir, args.conf, remote)
    native = NativeSubscription(pub, sub_cluster.dsn("bench_native"), "bench_native", tuple(PUBLICATIONS)).create(
        timeout=3600)
    native.wait_caught_up(timeout=600)
    peers = {"ours": (slot, sub), "native": (native.name, native.subscriber)}
    peer = None
    if args.pglogical:
        peer = PglogicalSubscription(pub, sub_cluster.dsn("bench_pglogical"), "bench_pgl").create()
        peers["pglogical"] = (peer.slot, peer.subscriber)
    print(f"publisher: pgbench -i -s {args.scale} in {init_s:.1f} s; our copy and catch-up {copy_s:.1f} s; "
          f"subscriptions: {', '.join(peers)}", flush=True)
    others = [s for name, (s, _) in peers.items() if name != "ours"]
    extra = apply_flags(args)

    calibrated = None
    if args.fractions:
        bench, _, _ = run_pgbench(pub_cluster, args, args.calibrate, None, workdir, lambda began, until: None)
        calibrated = bench["tps"]
        wait_caught_up(pub, others, 600)
        drain_processes(spec_file, pub, slot, current_lsn(pub), extra)
        print(f"the machine's rate: {calibrated:,.0f} tps (pgbench unthrottled for {args.calibrate} s, "
              "the subscriptions running)", flush=True)
    phases = []
    try:
        for fraction in args.fractions or [None]:
            rate = args.rate if fraction is None else fraction * calibrated
            print(f"phase: pgbench at {'full speed' if not rate else f'{rate:,.0f} tps'} for {args.seconds} s; "
                  f"load average {load_average()}", flush=True)

            def during(began: float, writing_until: float) -> tuple[list[dict], list[dict]]:
                with Sampler(pub, peers, began, writing_until, args.sample) as sampler:
                    runs = scheduled_runs(spec_file, pub, sub, slot, args.interval, args.seconds, began,
                                          writing_until, extra)
                return runs, sampler.samples
            bench, bench_args, (runs, samples) = run_pgbench(pub_cluster, args, args.seconds, rate, workdir, during)
            print(f"pgbench {' '.join(bench_args)}: {bench['transactions']:,} transactions, {bench['tps']:,.0f} tps",
                  flush=True)
            peers_s = wait_caught_up(pub, others, 1800)
            began = time.monotonic()
            final = drain_processes(spec_file, pub, slot, current_lsn(pub), extra)
            ours_s = time.monotonic() - began
            print(f"after pgbench: native and pglogical caught up in {peers_s:.1f} s; ours in {ours_s:.1f} s "
                  f"({len(final)} more runs)", flush=True)
            lags = [r["lag_seconds"] for r in runs if r["lag_seconds"] is not None]
            phases.append({
                "fraction": fraction, "rate": rate, "pgbench_transactions": bench["transactions"],
                "pgbench_tps": bench["tps"], "pgbench_progress": bench["progress"], "runs": runs, "samples": samples,
                "max_lag_seconds": max(lags, default=None),
                "max_lag_bytes": max((r["lag_bytes"] for r in runs), default=None),
                "max_sampled_lag_seconds": {name: max((x[f"{name}_seconds"] or 0 for x in samples), default=None)
                                            for name in peers},
                "under_two_intervals": all(r["under_two_intervals"] for r in runs),
                "peers_catch_up_seconds": peers_s, "final_runs": len(final), "final_seconds": ours_s,
                "load_average_end": load_average()})
        rows = None
        if args.compare:
            rows = {name: compare_with_publisher(pub, dsn) for name, (_, dsn) in peers.items()}
            print("every subscriber equals the publisher through the filters: " + ", ".join(
                f"{t} {n:,} rows" for t, n in rows["ours"].items()), flush=True)
    finally:
        with contextlib.suppress(Exception):
            native.drop()
        if peer:
            with contextlib.suppress(Exception):
                peer.drop()
    last = phases[-1]
    return {"scale": args.scale, "clients": args.clients, "threads": args.threads, "rate": args.rate,
            "fractions": args.fractions, "calibrated_tps": calibrated,
            "seconds": args.seconds, "interval": args.interval, "max_changes": args.max_changes,
            "time_budget": args.time_budget, "spark_conf": args.conf, "spark_connect": bool(remote),
            "subscriptions": list(peers), "decoder": decoder(), "phases": phases,
            # the last phase's figures at the top level, as before the phases
            "pgbench_transactions": last["pgbench_transactions"], "pgbench_tps": last["pgbench_tps"],
            "runs": last["runs"], "max_lag_seconds": last["max_lag_seconds"], "max_lag_bytes": last["max_lag_bytes"],
            "under_two_intervals": last["under_two_intervals"],
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
                   help="skip the comparison with the publisher at the end")
    p.add_argument("--fractions", type=lambda t: [float(v) for v in t.split(",")],
                   help="phases at these fractions of the machine's rate, e.g. 0.5,0.75,1 (default: one phase, --rate)")
    p.add_argument("--calibrate", type=int, default=30, help="seconds of unthrottled pgbench that measure the rate")
    p.add_argument("--sample", type=float, default=5, help="seconds between two samples of every lag (default 5)")
    p.add_argument("--pglogical", action="store_true",
                   help="a pglogical subscription beside native (needs postgresql-15-pglogical; runs PostgreSQL 15)")
    p.add_argument("--bin-dir", type=Path, help=f"the servers' binaries (default: embedded PostgreSQL 18, or "
                   f"{DEFAULT_BIN_DIR} with --pglogical)")
    apply_arguments(p, "keepup.json")
    args = parse(p, argv)

    with contextlib.ExitStack() as stack:
        if args.pglogical:
            pub_cluster, pub_data = start_cluster(args.bin_dir or DEFAULT_BIN_DIR)
            stack.callback(remove, pub_data)
            stack.callback(pub_cluster.stop)
            sub_cluster, sub_data = start_cluster(args.bin_dir or DEFAULT_BIN_DIR)
            stack.callback(remove, sub_data)
            stack.callback(sub_cluster.stop)
        else:
            pub_cluster = stack.enter_context(LocalPostgres.start(bin_dir=args.bin_dir))
            sub_cluster = stack.enter_context(LocalPostgres.start(bin_dir=args.bin_dir))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rowfilter-bench-keepup-")))
        print(f"PostgreSQL {server_version(pub_cluster)} (publisher and subscriber clusters); {os.cpu_count()} CPUs; "
              f"load average {load_average()}", flush=True)
        f = run(args, pub_cluster, sub_cluster, workdir,
                stack.enter_context(spark_server(args.spark_connect, workdir)))

    args.out.write_text(json.dumps(f, indent=1) + "\n")
    for phase in f["phases"]:
        print()
        print(f"phase at {phase['fraction'] or 1:.0%} of the rate: pgbench {phase['pgbench_tps']:,.0f} tps")
        print(f"{'run':>4}{'start s':>9}{'wall s':>8}{'changes':>10}{'lag MiB':>9}{'lag s':>8}")
        for i, r in enumerate(phase["runs"], 1):
            lag = "-" if r["lag_seconds"] is None else f"{r['lag_seconds']:.1f}"
            print(f"{i:>4}{r['start']:>9.1f}{r['wall']:>8.1f}{r['changes']:>10,}{r['lag_bytes'] / 2**20:>9.1f}{lag:>8}")
        print("largest sampled lag, seconds: " + ", ".join(
            f"{name} {v:.1f}" for name, v in phase["max_sampled_lag_seconds"].items() if v is not None))
        print(f"our lag under two intervals ({2 * f['interval']:.0f} s) after every run: "
              f"{'yes' if phase['under_two_intervals'] else 'NO'}")
    print("tables equal to the publisher's through the filters" if f["table_rows"] else "tables not compared")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
