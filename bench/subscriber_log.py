"""The change log's shapes measured on one backlog: a local directory, object storage, the subscriber as the log.

bench/drain.py's scenario (bench/pgbench_common.py: ``pgbench -i``, the publications with row filters, native
PostgreSQL subscribed beside us, ``pgbench -T`` with the native subscription disabled), with three
subscriptions of ours, copied and caught up before pgbench writes, each draining the same backlog in turn:

- **local**: the product's log in a directory (``rowfilter``'s apply, capture then apply, in this process);
- **s3**: the product's log in a bucket of moto's S3-compatible server on 127.0.0.1 (tests/s3_server.py);
- **table**: the subscriber as the log, PeerDB's shape (bench/subscriber_table_log.py, a prototype): the
  product's capture, its rows COPYed into ``rowfilter.bench_raw_changes`` of the subscriber with the
  position in one transaction, then applied from there in SQL in one transaction per batch and deleted.

Each round writes a backlog with pgbench; native catches up first (ENABLE until its slot confirms the target);
then each shape, in an order rotated per round, after a CHECKPOINT (so each pays its own full-page images), is
timed until its slot confirms the target, then its subscriber database is VACUUMed. ``full_page_writes`` is
turned on (the server's default, which the embedded cluster turns off): the WAL is a production server's;
``fsync`` stays off. Per shape: seconds and ratio against native; the WAL of the subscriber's cluster
(``pg_current_wal_lsn`` before/after, ``pg_stat_wal``: the publisher is a cluster of its own, as in
bench/keepup.py, and the other subscriber databases are idle meanwhile); the subscriber database's size, dead
tuples and autovacuum runs after the drain and after VACUUM; the log's own storage; the cost per change. The
table gives each figure's median over the rounds. Every published table is compared whole with native's. Not
part of the test suite.

    python bench/subscriber_log.py                          # scale 1, 3 rounds of 20 s of pgbench (about 4 minutes)
    python bench/subscriber_log.py --scale 5 --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import PhaseTimer, compare, create_database, current_lsn, load_average, set_native, slot_behind  # noqa: E402
from drain import TABLES, native_catch_up  # noqa: E402
from pgbench_common import (  # noqa: E402
    PUBLICATIONS,
    apply_arguments,
    parse,
    pgbench,
    pgbench_arguments,
    pgbench_figures,
    publisher_setup,
    server_version,
    setup_ours,
    subscriber_setup,
)
from subscriber_table_log import (  # noqa: E402
    RAW,
    SubscriberTableLog,
    apply_range,
    capturing_into,
    create,
    positions,
)

from airflow_provider_rowfilter.core.lsn import parse_lsn  # noqa: E402
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402
from airflow_provider_rowfilter.tooling.native import NativeSubscription  # noqa: E402

SHAPES = ("local", "s3", "table")


# --- what the cluster and a database hold ------------------------------------------------------------------
def wal(admin: str) -> dict:
    with psycopg.connect(admin, autocommit=True) as conn:
        lsn, records, fpi, size = conn.execute(
            "SELECT pg_current_wal_lsn()::text, wal_records, wal_fpi, wal_bytes FROM pg_stat_wal").fetchone()
    return {"lsn": lsn, "records": int(records), "fpi": int(fpi), "bytes": int(size)}


def wal_since(admin: str, before: dict) -> dict:
    after = wal(admin)
    return {"bytes": parse_lsn(after["lsn"]) - parse_lsn(before["lsn"]),
            **{f"stat_{k}": after[k] - before[k] for k in ("records", "fpi", "bytes")}}


def database_state(dsn: str) -> dict:
    """Size, dead and live tuples of the user tables, autovacuum runs; the raw table's own when there."""
    time.sleep(1.5)  # backends publish their table statistics at most once a second
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        size, = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        dead, live, autovacuums = conn.execute(
            "SELECT sum(n_dead_tup), sum(n_live_tup), sum(autovacuum_count) FROM pg_stat_user_tables").fetchone()
        raw = conn.execute(f"SELECT pg_total_relation_size(relid), n_dead_tup FROM pg_stat_user_tables "
                           f"WHERE relid = to_regclass('{RAW}')").fetchone()
    return {"database_bytes": int(size), "dead_tuples": int(dead or 0), "live_tuples": int(live or 0),
            "autovacuums": int(autovacuums or 0), "raw_table_bytes": raw[0] if raw else None,
            "raw_dead_tuples": raw[1] if raw else None}


def vacuum(admin: str, dsn: str) -> dict:
    before = wal(admin)
    began = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM")
    return {"seconds": time.monotonic() - began, "wal_bytes": wal_since(admin, before)["bytes"]}


def log_bytes(shape: str, spec: SubscriptionSpec, state: dict) -> int:
    """What the log itself holds after the drain: the directory, the bucket's objects, the raw table."""
    if shape == "table":
        return state["raw_table_bytes"]
    if shape == "local":
        return sum(p.stat().st_size for p in Path(spec.change_log).rglob("*") if p.is_file())
    from airflow_provider_rowfilter.change_log.store import open_change_log
    log = open_change_log(spec)
    import pyarrow.fs as pafs
    return sum(f.size for f in log.fs.get_file_info(pafs.FileSelector(log.key, recursive=True)) if f.size)


# --- the shapes ---------------------------------------------------------------------------------------------
def drain_product(spec: SubscriptionSpec, pub: str, slot: str, target: str, max_changes: int) -> dict:
    """The product's apply in this process (capture into its log, then apply), until the slot confirms target."""
    from airflow_provider_rowfilter.flows.apply.drain import apply

    changes = batches = 0
    timer = PhaseTimer().install()
    try:
        while slot_behind(pub, slot, target) > 0:
            result = apply(spec, max_changes=max_changes)
            changes, batches = changes + result.changes, batches + result.batches
    finally:
        timer.uninstall()
    phases = timer.take()
    return {"changes": changes, "batches": batches, "capture_seconds": phases.get("capture", 0.0),
            "phases": phases}


def drain_table(spec: SubscriptionSpec, pub: str, slot: str, target: str, max_changes: int, staging: Path) -> dict:
    """The product's capture into the subscriber's raw table, then its SQL apply, batch by batch."""
    from airflow_provider_rowfilter.publisher.capture import capture

    log = SubscriberTableLog(staging, spec.subscriber, spec.subscription)
    changes = batches = 0
    capture_s = apply_s = 0.0
    while slot_behind(pub, slot, target) > 0:
        began = time.monotonic()
        with capturing_into(log):
            capture(spec, max_changes=max_changes)
        captured, applied = positions(spec.subscriber, spec.subscription)
        middle = time.monotonic()
        if captured > applied:
            changes += apply_range(spec.subscriber, spec.subscription, applied, captured)
            batches += 1
        capture_s, apply_s = capture_s + middle - began, apply_s + time.monotonic() - middle
    return {"changes": changes, "batches": batches, "copied": log.copied, "capture_seconds": capture_s,
            "copy_seconds": log.copy_seconds, "apply_seconds": apply_s}


def _warm_up() -> None:
    """Import what the shapes run before any is timed (the first would pay it alone)."""
    import airflow_provider_rowfilter.change_log.store  # noqa: F401
    import airflow_provider_rowfilter.flows.apply.drain  # noqa: F401
    import airflow_provider_rowfilter.flows.apply.net_effect  # noqa: F401
    import airflow_provider_rowfilter.publisher.capture  # noqa: F401
    import airflow_provider_rowfilter.subscriber.apply_target  # noqa: F401


def setup(args, cluster: LocalPostgres, subscriber: LocalPostgres, workdir: Path, bucket: str
          ) -> tuple[dict, NativeSubscription, dict]:
    """The publisher, native's subscription and our three, copied and caught up; returns (databases, native, ours)."""
    admin, pub = subscriber.dsn(), cluster.dsn("bench_pub")
    dbs = {"native": "bench_native", **{s: f"bench_{s}" for s in SHAPES}}
    with psycopg.connect(admin, autocommit=True) as conn:  # the WAL of a production server: with its page images
        conn.execute("ALTER SYSTEM SET full_page_writes = on")
        conn.execute("SELECT pg_reload_conf()")
    create_database(cluster.dsn(), "bench_pub")
    for name in dbs.values():
        create_database(admin, name)
    publisher_setup(cluster, "bench_pub", args.scale)
    for name in dbs.values():
        subscriber_setup(subscriber, name)
    native = NativeSubscription(pub, subscriber.dsn(dbs["native"]), "bench_native", tuple(PUBLICATIONS)).create(timeout=3600)
    ours = {}
    for shape in SHAPES:
        (workdir / shape).mkdir()
        log = f"s3://{bucket}/bench/changes" if shape == "s3" else None
        spec_file, slot, copy_s = setup_ours(pub, subscriber.dsn(dbs[shape]), f"bench_{shape}", workdir / shape,
                                             args.conf, change_log=log)
        ours[shape] = (SubscriptionSpec.load(spec_file), slot)
        print(f"ours ({shape}) copied and caught up in {copy_s:.1f} s", flush=True)
    table_spec, table_slot = ours["table"]
    with psycopg.connect(pub, autocommit=True) as conn:
        start, = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                              (table_slot,)).fetchone()
    create(table_spec.subscriber, table_spec.subscription, parse_lsn(start))
    native.wait_caught_up(timeout=600)
    set_native(native, False)
    _warm_up()
    return dbs, native, ours


def one_round(args, number: int, cluster: LocalPostgres, subscriber: LocalPostgres, workdir: Path, dbs: dict,
              native: NativeSubscription, ours: dict) -> dict:
    """pgbench's backlog, then native and every shape drain it, our shapes in an order rotated per round."""
    admin, pub = subscriber.dsn(), cluster.dsn("bench_pub")
    bench_args = ["-n", "-c", str(args.clients), "-j", str(args.threads), "-T", str(args.seconds)]
    bench = pgbench_figures(pgbench(cluster, "bench_pub", *bench_args))
    target = current_lsn(pub)
    order = SHAPES[number % 3:] + SHAPES[:number % 3]
    print(f"round {number + 1}: pgbench {' '.join(bench_args)}: {bench['transactions']:,} transactions; "
          f"{slot_behind(pub, native.name, target) / 2**20:,.1f} MiB of WAL behind; then native, "
          f"{', '.join(order)}; load average {load_average()}", flush=True)
    figures: dict[str, dict] = {}
    for shape in ("native", *order):
        dsn = subscriber.dsn(dbs[shape])
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        before, load = wal(admin), load_average()
        before_state = database_state(dsn)
        began = time.monotonic()
        if shape == "native":
            native_catch_up(native, target)
            drained: dict = {}
        elif shape == "table":
            drained = drain_table(ours[shape][0], pub, ours[shape][1], target, args.max_changes or 100_000,
                                  workdir / "table-staging")
        else:
            drained = drain_product(ours[shape][0], pub, ours[shape][1], target, args.max_changes or 100_000)
        seconds = time.monotonic() - began
        if shape == "native":  # its worker leaves: no writes of its own in the others' WAL, its WAL statistics published
            set_native(native, False)
        shape_wal = wal_since(admin, before)
        after_drain = database_state(dsn)
        after_drain["autovacuums_in_drain"] = after_drain["autovacuums"] - before_state["autovacuums"]
        figures[shape] = {"seconds": seconds, "load_average": load, "wal": shape_wal, "after_drain": after_drain,
                          "vacuum": vacuum(admin, dsn), "after_vacuum": database_state(dsn), **drained}
        if shape != "native":
            figures[shape]["log_bytes_after_drain"] = log_bytes(shape, ours[shape][0], after_drain)
        print(f"  {shape}: {seconds:.2f} s, {shape_wal['bytes']:,} WAL bytes ({shape_wal['stat_fpi']:,} FPI), "
              f"{drained.get('changes', '-')} changes; load average {load}", flush=True)
    for shape in SHAPES:
        rows = compare(subscriber.dsn(dbs["native"]), subscriber.dsn(dbs[shape]), TABLES)
        figures[shape]["table_rows"] = rows
    print("  every shape's tables equal native's: " + ", ".join(f"{t} {n:,}" for t, n in rows.items()), flush=True)
    changes = figures["local"]["changes"]
    for f in figures.values():
        f["ratio"] = figures["native"]["seconds"] / f["seconds"]
        f["us_per_change"] = f["seconds"] * 1e6 / changes
        f["wal_bytes_per_change"] = f["wal"]["bytes"] / changes
        f["wal_with_vacuum_bytes_per_change"] = (f["wal"]["bytes"] + f["vacuum"]["wal_bytes"]) / changes
    return {"pgbench_transactions": bench["transactions"], "changes": changes, "target_lsn": target,
            "order": order, "shapes": figures}


def run(args, cluster: LocalPostgres, subscriber: LocalPostgres, workdir: Path, bucket: str) -> dict:
    dbs, native, ours = setup(args, cluster, subscriber, workdir, bucket)
    try:
        rounds = [one_round(args, n, cluster, subscriber, workdir, dbs, native, ours) for n in range(args.rounds)]
    finally:
        with contextlib.suppress(Exception):
            native.drop()
    return {"scale": args.scale, "clients": args.clients, "threads": args.threads, "seconds": args.seconds,
            "max_changes": args.max_changes or 100_000, "rounds": rounds, "postgres": server_version(cluster),
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M")}


def table(f: dict) -> str:
    """The figures as a Markdown table (what docs/adr/change-log-on-object-storage.md quotes): medians over the rounds."""
    rows = ["| shape | drain s, per round | ratio native/ours | µs per change | subscriber WAL bytes per change: "
            "drain + VACUUM | FPI in the drain | autovacuums in the drain | log after drain | dead tuples after drain "
            "→ after VACUUM | database after drain → after VACUUM |", "|" + "---|" * 10]
    changes = runs_changes(f)
    for shape in ("native", *SHAPES):
        runs = [r["shapes"][shape] for r in f["rounds"]]

        def med(get, runs=runs):
            return statistics.median(get(s) for s in runs)

        seconds = " / ".join(f"{s['seconds']:.2f}" for s in runs)
        log = "-" if shape == "native" else f"{med(lambda s: s['log_bytes_after_drain']) / 1024:,.0f} KiB"
        wal_drain, wal_vacuum = med(lambda s: s["wal_bytes_per_change"]), med(lambda s: s["vacuum"]["wal_bytes"]) / changes
        dead = f"{med(lambda s: s['after_drain']['dead_tuples']):,.0f} → {med(lambda s: s['after_vacuum']['dead_tuples']):,.0f}"
        size = (f"{med(lambda s: s['after_drain']['database_bytes']) / 2**20:.1f} → "
                f"{med(lambda s: s['after_vacuum']['database_bytes']) / 2**20:.1f} MiB")
        autovacuums = sum(s["after_drain"]["autovacuums_in_drain"] for s in runs)
        rows.append(f"| {shape} | {seconds} | {med(lambda s: s['ratio']):.3f} | {med(lambda s: s['us_per_change']):.1f} "
                    f"| {wal_drain:.0f} + {wal_vacuum:.0f} | {med(lambda s: s['wal']['stat_fpi']):,.0f} | {autovacuums} "
                    f"| {log} | {dead} | {size} |")
    return "\n".join(rows)


def runs_changes(f: dict) -> float:
    return statistics.median(r["changes"] for r in f["rounds"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pgbench_arguments(p)
    p.set_defaults(scale=1)
    p.add_argument("--seconds", type=int, default=20, help="pgbench -T: how long it writes (default 20)")
    p.add_argument("--rounds", type=int, default=3, help="backlogs drained, the shapes' order rotated (default 3)")
    apply_arguments(p, "subscriber-log.json")
    args = parse(p, argv)
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalPostgres.start())  # the publisher
        subscriber = stack.enter_context(LocalPostgres.start())  # every subscriber database: its WAL is theirs alone
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rowfilter-bench-subscriber-log-")))
        from tests.s3_server import s3_server  # moto's server, as the tests run it
        s3 = stack.enter_context(s3_server())
        os.environ.update(s3.environment())  # the standard variables the product's S3 log reads
        print(f"PostgreSQL {server_version(cluster)}; {os.cpu_count()} CPUs; load average {load_average()}", flush=True)
        f = run(args, cluster, subscriber, workdir, s3.bucket())
    args.out.write_text(json.dumps(f, indent=1) + "\n")
    print()
    print(table(f))
    last = f["rounds"][-1]
    t = last["shapes"]["table"]
    print(f"\nmedian {runs_changes(f):,.0f} changes per round; the table shape in the last round: capture "
          f"{t['capture_seconds']:.2f} s (the COPY into the raw table {t['copy_seconds']:.2f} s), apply "
          f"{t['apply_seconds']:.2f} s; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
