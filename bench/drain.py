"""Draining a pgbench backlog: native catch-up against `rowfilter apply` processes run back to back.

PostgreSQL's own pgbench (``pgbench -i -s --scale``) fills the publisher database of a throwaway
cluster (tooling/embedded.py). Published, as in :data:`PUBLICATIONS`:
- ``pgbench_accounts WHERE (aid % 10 < 5)`` and ``pgbench_tellers WHERE (tid % 2 = 0)`` (filters
  on the key, the replica identity, so UPDATEs are published), ``pgbench_branches`` unfiltered;
- ``pgbench_history`` (no key) ``WHERE (aid % 10 < 5) WITH (publish = 'insert')``: the history of the
  published accounts (a filter on ``bid`` would keep nothing at scale 1, one branch).
Subscribed natively (tooling/native.NativeSubscription, database ``bench_native``) and by us
(``rowfilter refresh``, ``snapshot``, ``apply`` processes, database ``bench_ours``), both copies
done and caught up. Then, with the native subscription DISABLED, ``pgbench -n -c --clients -j
--threads -T --seconds`` writes (the TPC-B-like script: three UPDATEs and one INSERT per
transaction). The publisher's WAL position at its end is the target; timed apart, one after the other:
- native: ``ALTER SUBSCRIPTION … ENABLE`` until its slot's confirmed_flush_lsn reaches the target;
- ours: ``rowfilter apply --spec … --json`` processes, one per run as a scheduler starts them, back to
  back until our slot's confirmed_flush_lsn reaches the target (a run that drains the whole backlog in
  consecutive batches is one process; a run of one bounded batch is one process per batch).
Then every published table is compared whole, native's against ours, and the result is written as
JSON (``--out``). Not part of the test suite.

With ``--pglogical`` a pglogical 2 subscription (bench/pglogical_peer.py: replication sets with the
same row filters, database ``bench_pglogical``) is copied beside them, disabled with the native one,
and timed the same way after it; the cluster is then Debian's PostgreSQL 15 with pglogical preloaded
(``--bin-dir``).

    python bench/drain.py                              # scale 10, 60 s of pgbench (about 10 minutes)
    python bench/drain.py --scale 1 --seconds 10       # smoke run
    python bench/drain.py --time-budget 50             # passed to every `rowfilter apply` run
    python bench/drain.py --spark-connect              # our processes as clients of a local Connect server
    python bench/drain.py --pglogical                  # beside pglogical too (PostgreSQL 15)
    python bench/drain.py --s3                         # a second subscription of ours, its change log on an
        # S3-compatible server on 127.0.0.1 (moto's, tests/s3_server.py), timed after the local one: both ratios
    python bench/drain.py --workload update --scale 20 --phases
        # instead of pgbench, ONE transaction updating every published account (1M at scale 20);
        # --phases: ours in this process, timed by phase (bench/apply.py PhaseTimer)
    python bench/drain.py --workload update --scale 6 --phases --before-arrow-fold
        # the same at 300,000 rows, reduced as before flows/apply/arrow_fold.py (by Spark: the "before" of a comparison)
    python bench/drain.py --workload update --scale 6 --phases --read-back
        # the reducer reads the segment back from the log instead of taking the capture's rows (the "before")
    python bench/drain.py --workload update --scale 6 --phases --before-keys-once
        # the same, the subscriber's side as before subscriber/typed_keys.py (each row written twice there)
    python bench/drain.py --workload update --scale 6 --phases --before-direct-update
        # the same, the UPDATEs through the keys table as before subscriber/direct_update.py (one statement)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import psycopg.sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import (  # noqa: E402  (bench/apply.py: the shared helpers; puts this checkout on the path)
    CLI,
    CpuMeter,
    PhaseTimer,
    compare,
    create_database,
    current_lsn,
    drain_processes,
    load_average,
    phase_breakdown,
    run_job,
    set_native,
    slot_behind,
)
from pgbench_common import (  # noqa: E402  (the pgbench scenario, shared with bench/keepup.py)
    ACCOUNTS_FILTER,
    PUBLICATIONS,
    apply_arguments,
    apply_flags,
    decoder,
    parse,
    pgbench,
    pgbench_arguments,
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

TABLES = ("public.pgbench_accounts", "public.pgbench_tellers", "public.pgbench_branches", "public.pgbench_history")


def native_catch_up(native: NativeSubscription, target: str, timeout: float = 7200) -> float:
    """ENABLE the native subscription; seconds until its slot's confirmed_flush_lsn reaches ``target``."""
    began = time.monotonic()
    set_native(native, True)
    wait_confirmed(native.publisher, native.name, target, began + timeout)
    return time.monotonic() - began


def pglogical_catch_up(peer: PglogicalSubscription, target: str, timeout: float = 7200) -> float:
    """Enable the pglogical subscription; seconds until its slot's confirmed_flush_lsn reaches ``target``."""
    slot = peer.slot
    began = time.monotonic()
    peer.set_enabled(True)
    wait_confirmed(peer.publisher, slot, target, began + timeout)
    return time.monotonic() - began


def wait_confirmed(pub: str, slot: str, target: str, deadline: float) -> None:
    while slot_behind(pub, slot, target) > 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"slot {slot} has not confirmed {target} in time")
        time.sleep(0.02)


def in_process(spec_file: Path, args) -> tuple[list[dict], dict[str, float]]:
    """Ours as one draining run in this process (the job's ``apply``), its time by phase."""
    from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
    from airflow_provider_rowfilter.flows.apply.drain import apply

    spec = SubscriptionSpec.load(spec_file)
    if args.before_arrow_fold:  # the reducers before flows/apply/arrow_fold.py: the walk up to 200,000 changes, then Spark
        from airflow_provider_rowfilter.flows.apply import net_effect, reducers

        reducers.COLUMNS_BATCH_CHANGES = reducers.IN_PROCESS_BATCH_CHANGES
        net_effect.reduce_batch = net_effect.reduce_changes
    if args.read_back:  # before the hand-over: the reducer reads every segment back from the log
        from airflow_provider_rowfilter.flows.apply import capture_ahead

        capture_ahead.HOLD = None
    if args.before_keys_once:  # the in-process rows COPYed into the transaction's stage, then read into the keys table
        from airflow_provider_rowfilter.subscriber import typed_keys

        typed_keys.WRITE_KEYS_ONCE = False
    if args.before_direct_update:  # a batch of UPDATEs of existing rows through the keys table, not one statement
        from airflow_provider_rowfilter.subscriber import direct_update

        direct_update.DIRECT_UPDATE = False
    timer = PhaseTimer().install()
    account = None
    if args.account:  # per batch: its phases and every statement it sent (bench/batch_account.py)
        from batch_account import BatchAccount

        account = BatchAccount().install()
    profile = None
    if args.profile:  # cProfile of this thread (the first batch's capture runs in it; a capture ahead does not)
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    try:
        began = time.monotonic()
        result = apply(spec, **({"max_changes": args.max_changes} if args.max_changes else {}))
        wall = time.monotonic() - began
    finally:
        timer.uninstall()
        if account is not None:
            account.uninstall()
            args.account.write_text(json.dumps(account.report(), indent=1) + "\n")
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
    run = {"wall": wall, "changes": result.changes, "transactions": result.transactions, "batches": result.batches}
    return [run], phase_breakdown([{"phases": timer.take()}], wall)


# --- main ---------------------------------------------------------------------------------------------
def run(args, cluster: LocalPostgres, workdir: Path, remote: str | None = None) -> dict:
    admin = cluster.dsn()
    pub, native_db, ours_db, pgl_db = (cluster.dsn(n) for n in ("bench_pub", "bench_native", "bench_ours",
                                                                 "bench_pglogical"))
    databases = ("bench_pub", "bench_native", "bench_ours", *(["bench_pglogical"] if args.pglogical else []),
                 *(["bench_ours_s3"] if args.s3 else []), *(["bench_ours_b"] if args.versus_max_changes else []))
    for name in databases:
        create_database(admin, name)
    if args.decoding_work_mem:  # every decoding session's (native's walsender, pglogical's, our capture's)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("ALTER SYSTEM SET logical_decoding_work_mem = {}").format(
                psycopg.sql.Literal(args.decoding_work_mem)))
            conn.execute("SELECT pg_reload_conf()")
        with psycopg.connect(pub) as conn:  # a new session: what the capture's and the walsenders' get
            print(f"logical_decoding_work_mem {conn.execute('SHOW logical_decoding_work_mem').fetchone()[0]}",
                  flush=True)
    init_s = publisher_setup(cluster, "bench_pub", args.scale)
    for name in databases[1:]:
        subscriber_setup(cluster, name)
    print(f"publisher: pgbench -i -s {args.scale} in {init_s:.1f} s; load average {load_average()}", flush=True)

    began = time.monotonic()
    native = NativeSubscription(pub, native_db, "bench_native", tuple(PUBLICATIONS)).create(timeout=3600)
    native_copy = time.monotonic() - began
    spec_file, slot, our_copy = setup_ours(pub, ours_db, "bench_ours", workdir, args.conf, remote,
                                           filtering=args.filtering)
    s3_ours = None
    if args.s3:  # the same subscription of ours again, its change log in a bucket
        (workdir / "s3").mkdir()
        s3_ours = setup_ours(pub, cluster.dsn("bench_ours_s3"), "bench_ours_s3", workdir / "s3", args.conf, remote,
                             change_log=f"s3://{args.s3.bucket()}/bench/changes", filtering=args.filtering)
    ours_b = None
    if args.versus_max_changes:  # the same subscription of ours again, drained with a fixed --max-changes
        (workdir / "b").mkdir()
        ours_b = setup_ours(pub, cluster.dsn("bench_ours_b"), "bench_ours_b", workdir / "b", args.conf, remote)
    native.wait_caught_up(timeout=600)
    peer, pgl_copy = None, None
    if args.pglogical:
        began = time.monotonic()
        peer = PglogicalSubscription(pub, pgl_db, "bench_pgl").create()
        pgl_copy = time.monotonic() - began
    print(f"initial copies: native {native_copy:.1f} s, ours {our_copy:.1f} s (refresh, snapshot, apply processes)"
          + (f", pglogical {pgl_copy:.1f} s" if peer else ""), flush=True)
    pgl_s = pgl_cpu = load_pgl = None
    try:
        set_native(native, False)
        if peer:
            peer.set_enabled(False)
        if args.workload == "update":
            bench_args = [f"UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE {ACCOUNTS_FILTER}"]
            began = time.monotonic()
            with psycopg.connect(pub, autocommit=True) as conn:
                updated = conn.execute(bench_args[0]).rowcount
            written = time.monotonic() - began
            bench = {"transactions": 1, "tps": 1 / written, "progress": [], "rows_updated": updated}
            print(f"one transaction updated {updated:,} published rows", flush=True)
        else:
            bench_args = ["-n", "-P", "10", "-c", str(args.clients), "-j", str(args.threads), "-T", str(args.seconds)]
            began = time.monotonic()
            output = pgbench(cluster, "bench_pub", *bench_args)
            written = time.monotonic() - began
            bench = pgbench_figures(output)
        target = current_lsn(pub)
        backlog = slot_behind(pub, native.name, target)
        print(f"pgbench {' '.join(bench_args)}: {bench['transactions']:,} transactions ({bench['tps']:,.0f} tps) in "
              f"{written:.1f} s; {backlog / 2**20:,.0f} MiB of WAL behind, target {target}", flush=True)

        load_native = load_average()
        with CpuMeter() as native_cpu:
            native_s = native_catch_up(native, target)
        print(f"native catch-up: {native_s:.2f} s, {native_cpu.seconds:.1f} core-seconds busy; "
              f"load average {load_native}", flush=True)
        if peer:
            load_pgl = load_average()
            with CpuMeter() as meter:
                pgl_s = pglogical_catch_up(peer, target)
            pgl_cpu = meter.seconds
            print(f"pglogical catch-up: {pgl_s:.2f} s, {pgl_cpu:.1f} core-seconds busy; load average {load_pgl}",
                  flush=True)

        extra = apply_flags(args)
        versus = None
        if ours_b is not None and args.versus_first:  # the fixed bound drained before ours (the order's bias)
            versus = _drain_versus(args, ours_b, pub, target, extra)
        load_ours = load_average()
        phases = None
        began = time.monotonic()
        with CpuMeter() as our_cpu:
            if args.phases:
                runs, phases = in_process(spec_file, args)
            else:
                runs = drain_processes(spec_file, pub, slot, target, extra, verbose=True)
        our_s = time.monotonic() - began
        if phases:
            print("ours by phase: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()), flush=True)
        changes, txns = sum(r["changes"] for r in runs), sum(r["transactions"] for r in runs)
        print(f"ours: {our_s:.2f} s in {len(runs)} rowfilter apply processes ({changes:,} changes in {txns:,} "
              f"transactions in their summaries), {our_cpu.seconds:.1f} core-seconds busy; load average {load_ours}", flush=True)

        if ours_b is not None and not args.versus_first:
            versus = _drain_versus(args, ours_b, pub, target, extra)
        if versus is not None:
            versus["ratio"] = native_s / versus["seconds"]
            print(f"ours with --max-changes {args.versus_max_changes}: {versus['seconds']:.2f} s, ratio native/it "
                  f"{versus['ratio']:.3f} (ours {native_s / our_s:.3f}); load average {versus['load_average']}",
                  flush=True)
        s3_figures = None
        if s3_ours is not None:
            began = time.monotonic()
            s3_runs = drain_processes(s3_ours[0], pub, s3_ours[1], target, extra, verbose=True)
            s3_s = time.monotonic() - began
            s3_batches, local_batches = (sum(r.get("batches") or 1 for r in rs) for rs in (s3_runs, runs))
            s3_figures = {"ours_s3_seconds": s3_s, "ratio_s3": native_s / s3_s, "s3_processes": len(s3_runs),
                          "s3_batches": s3_batches, "local_batches": local_batches,
                          "s3_cost_per_batch_seconds": s3_s / s3_batches - our_s / local_batches,
                          "s3_runs": s3_runs, "s3_table_rows": compare(native_db, cluster.dsn("bench_ours_s3"), TABLES)}
            print(f"ours, change log on S3: {s3_s:.2f} s in {len(s3_runs)} processes, {s3_batches} batches "
                  f"(local: {our_s:.2f} s, {local_batches} batches); ratio native/ours-on-S3 "
                  f"{native_s / s3_s:.3f}", flush=True)
        native.wait_caught_up(timeout=600)
        rows = compare(native_db, ours_db, TABLES)
        if ours_b is not None:
            assert compare(native_db, cluster.dsn("bench_ours_b"), TABLES) == rows
        print("subscribers equal: " + ", ".join(f"{t} {n:,} rows" for t, n in rows.items()), flush=True)
        if peer:
            print("pglogical's equal native's: " + ", ".join(
                f"{t} {n:,} rows" for t, n in compare(native_db, pgl_db, TABLES).items()), flush=True)
        empty = run_job([CLI, "apply", "--spec", str(spec_file), "--json"], workdir)["wall"]
    finally:
        with contextlib.suppress(Exception):
            native.drop()
        if peer:
            with contextlib.suppress(Exception):
                peer.drop()

    return {"scale": args.scale, "clients": args.clients, "threads": args.threads, "seconds": args.seconds,
            "max_changes": args.max_changes, "time_budget": args.time_budget, "spark_conf": args.conf,
            "spark_connect": bool(remote),
            "pgbench_transactions": bench["transactions"], "pgbench_tps": bench["tps"],
            "pgbench_progress": bench["progress"], "backlog_wal_bytes": backlog, "target_lsn": target,
            "native_seconds": native_s, "ours_seconds": our_s, "ratio": native_s / our_s,
            "pglogical_seconds": pgl_s, "ratio_pglogical": None if pgl_s is None else pgl_s / our_s,
            "pglogical_cpu_seconds": pgl_cpu, "pglogical_copy_seconds": pgl_copy, "load_average_pglogical": load_pgl,
            "decoder": decoder(), "workload": args.workload, "phases_seconds": phases,
            "before_arrow_fold": args.before_arrow_fold, "read_back": args.read_back,
            "logical_decoding_work_mem": args.decoding_work_mem,
            "before_keys_once": args.before_keys_once, "before_direct_update": args.before_direct_update,
            "applied_changes": changes, "applied_transactions": txns, "processes": len(runs), "runs": runs,
            "native_cpu_seconds": native_cpu.seconds, "ours_cpu_seconds": our_cpu.seconds,
            "empty_run_seconds": empty, "native_copy_seconds": native_copy, "ours_copy_seconds": our_copy,
            "tables_equal": True, "table_rows": rows, "load_average_native": load_native,
            "load_average_ours": load_ours, "cpus": os.cpu_count(), "postgres": server_version(cluster),
            "date": time.strftime("%Y-%m-%d %H:%M"), **(s3_figures or {}),
            **({"versus_max_changes": args.versus_max_changes, "versus": versus} if versus else {})}


def _drain_versus(args, ours_b, pub: str, target: str, extra: list[str]) -> dict:
    """The second subscription of ours drained by ``rowfilter apply`` processes with ``--versus-max-changes``."""
    load = load_average()
    began = time.monotonic()
    runs = drain_processes(ours_b[0], pub, ours_b[1], target, [*extra, "--max-changes", str(args.versus_max_changes)],
                           verbose=True)
    return {"seconds": time.monotonic() - began, "load_average": load, "runs": runs,
            "batches": sum(r.get("batches") or 1 for r in runs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pgbench_arguments(p)
    p.add_argument("--seconds", type=int, default=60, help="pgbench -T: how long it writes (default 60)")
    p.add_argument("--workload", choices=("pgbench", "update"), default="pgbench",
                   help="pgbench for --seconds (default), or ONE transaction updating every published account")
    p.add_argument("--phases", action="store_true", help="ours in this process, timed by phase")
    p.add_argument("--filtering", choices=("source", "spark"),
                   help="our spec's filtering (spark: every batch judged by Spark; default: the spec's own)")
    p.add_argument("--decoding-work-mem", metavar="SIZE",
                   help="logical_decoding_work_mem for every decoding session (ALTER SYSTEM; default the server's, "
                   "64MB): a transaction larger is spilled to disk and read back by each of them")
    p.add_argument("--read-back", action="store_true",
                   help="with --phases: the reducer reads each segment back from the log, as before the capture "
                   "handed its rows over (flows/apply/capture_ahead.py HOLD)")
    p.add_argument("--account", type=Path, help="with --phases: write each batch's phases and statements (count, "
                   "seconds) as JSON to this file (bench/batch_account.py)")
    p.add_argument("--profile", type=Path, help="with --phases: write cProfile's statistics of our run to this file")
    p.add_argument("--before-arrow-fold", action="store_true",
                   help="with --phases: the reducers before flows/apply/arrow_fold.py (change by change up to 200,000 "
                   "changes, Spark past it)")
    p.add_argument("--before-keys-once", action="store_true",
                   help="with --phases: the subscriber's side before subscriber/typed_keys.py (the rows reduced in the "
                        "process staged as text, then read again into the keys table)")
    p.add_argument("--before-direct-update", action="store_true",
                   help="with --phases: a table's batch of UPDATEs of existing rows through the keys table, as before "
                        "subscriber/direct_update.py (one UPDATE straight from the rows)")
    p.add_argument("--pglogical", action="store_true",
                   help="a pglogical subscription beside native (needs postgresql-15-pglogical; runs PostgreSQL 15)")
    p.add_argument("--bin-dir", type=Path, help=f"the server's binaries (default: embedded PostgreSQL 18, or "
                   f"{DEFAULT_BIN_DIR} with --pglogical)")
    p.add_argument("--versus-max-changes", type=int, metavar="N",
                   help="a second subscription of ours drained with --max-changes N after ours (with --versus-first, "
                   "before): one backlog, two batch sizes, both against native")
    p.add_argument("--versus-first", action="store_true", help="with --versus-max-changes: drain that one first")
    p.add_argument("--s3", action="store_true",
                   help="also drain a subscription of ours whose change log is on an S3-compatible server on 127.0.0.1")
    p.add_argument("--track-commit-timestamp", action="store_true",
                   help="with --pglogical: track_commit_timestamp on (our subscriber then counts origin conflicts)")
    apply_arguments(p, "drain.json")
    args = parse(p, argv)

    with contextlib.ExitStack() as stack:
        if args.pglogical:
            cluster, data = start_cluster(args.bin_dir or DEFAULT_BIN_DIR,
                                          track_commit_timestamp=args.track_commit_timestamp)
            stack.callback(remove, data)
            stack.callback(cluster.stop)
        else:
            cluster = stack.enter_context(LocalPostgres.start(bin_dir=args.bin_dir))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rowfilter-bench-drain-")))
        if args.s3:
            from tests.s3_server import s3_server  # moto's server, as the tests run it
            args.s3 = stack.enter_context(s3_server())
            os.environ.update(args.s3.environment())  # the standard variables every job process reads
        print(f"PostgreSQL {server_version(cluster)}; {os.cpu_count()} CPUs; load average {load_average()}", flush=True)
        f = run(args, cluster, workdir, stack.enter_context(spark_server(args.spark_connect, workdir)))

    args.out.write_text(json.dumps(f, indent=1) + "\n")
    print()
    print(f"{'':34}{'seconds':>10}")
    print(f"{'native catch-up':34}{f['native_seconds']:>10.2f}")
    if f["pglogical_seconds"] is not None:
        print(f"{'pglogical catch-up':34}{f['pglogical_seconds']:>10.2f}")
    print(f"{'rowfilter apply, ' + str(f['processes']) + ' processes':34}{f['ours_seconds']:>10.2f}")
    if f["ratio_pglogical"] is not None:
        print(f"ratio pglogical/ours: {f['ratio_pglogical']:.3f}")
    print(f"ratio native/ours: {f['ratio']:.3f}  (goal >= 1.0); {f['pgbench_transactions']:,} pgbench transactions, "
          f"{f['applied_changes']:,} changes in {f['applied_transactions']:,} transactions in our runs' summaries; "
          f"tables identical")
    print("per process: " + ", ".join(f"{r['wall']:.1f} s" for r in f["runs"]))
    if f.get("ratio_s3") is not None:
        print(f"ratio native/ours with the change log on S3: {f['ratio_s3']:.3f}; the store costs "
              f"{f['s3_cost_per_batch_seconds']:+.3f} s per batch ({f['s3_batches']} batches)")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
