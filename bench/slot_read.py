"""Reading a slot: the SQL function the capture calls against the streaming replication protocol.

A pgbench backlog (``pgbench -i -s --scale``, then ``--seconds`` of ``pgbench -c 4 -j 2``) on a
publisher published as in bench/drain.py, with one pgoutput slot made before the writes and copied
(``pg_copy_logical_replication_slot``) once per reading, so each reads the same changes from the same
position. Timed, one after the other, each until the backlog's end:

- ``sql-batches``: what the capture does: ``pg_logical_slot_peek_binary_changes(slot, NULL,
  --max-changes, …)`` through a binary server-side cursor, the rows fetched to this process
  ``--fetch-rows`` at a time, then ``pg_replication_slot_advance`` to the last Commit's end; again
  until the slot is past the target. Every call decodes again from the slot's ``restart_lsn``.
- ``sql-once``: one call over the whole backlog, counted on the server (nothing crosses the wire).
- ``streaming``: ``pg_recvlogical --start --endpos`` (the walsender: one decoding pass, streamed as it
  goes, the client confirming as it writes) into /dev/null.

Each also reports the machine's busy core-seconds (/proc/stat). Not part of the test suite.

    python bench/slot_read.py                       # scale 10, 60 s of pgbench
    python bench/slot_read.py --scale 1 --seconds 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import ROOT, CpuMeter, create_database, current_lsn, load_average, slot_behind  # noqa: E402
from pgbench_common import PUBLICATIONS, pgbench, pgbench_env, pgbench_figures, publisher_setup, server_version  # noqa: E402

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402

SOURCE = "bench_read_source"
NAMES = ",".join(f'"{n}"' for n in PUBLICATIONS)


def copy_slot(pub: str, name: str) -> None:
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (SOURCE, name))


def drop_slot(pub: str, name: str) -> None:
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))


def sql_batches(pub: str, slot: str, target: str, max_changes: int, fetch_rows: int) -> dict:
    calls = rows = size = 0
    with psycopg.connect(pub, autocommit=True) as conn:
        while slot_behind(pub, slot, target) > 0:
            end = None
            with conn.transaction(), conn.cursor("read", binary=True) as cursor:
                cursor.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, 'proto_version', "
                               "'1', 'publication_names', %s)", (slot, max_changes, NAMES))
                while fetched := cursor.fetchmany(fetch_rows):
                    rows += len(fetched)
                    size += sum(len(r[0]) for r in fetched)
                    last = fetched[-1][0]
                    if last[:1] == b"C":
                        end = struct.unpack_from(">Q", last, 10)[0]
            calls += 1
            if end is None:
                break
            conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, f"{end >> 32:X}/{end & 0xFFFFFFFF:X}"))
    return {"calls": calls, "rows": rows, "bytes": size}


def sql_once(pub: str, slot: str) -> dict:
    with psycopg.connect(pub, autocommit=True) as conn:
        rows, size = conn.execute(
            "SELECT count(*), coalesce(sum(octet_length(data)), 0) FROM pg_logical_slot_peek_binary_changes("
            "%s, NULL, NULL, 'proto_version', '1', 'publication_names', %s)", (slot, NAMES)).fetchone()
    return {"calls": 1, "rows": int(rows), "bytes": int(size)}


def streaming(cluster: LocalPostgres, slot: str, target: str) -> dict:
    done = subprocess.run(["pg_recvlogical", "-d", "bench_pub", "--start", "--no-loop", "-S", slot, "-E", target,
                           "-f", "/dev/null", "-o", "proto_version=1",
                           "-o", f"publication_names={','.join(PUBLICATIONS)}", "-s", "1"],
                          env=pgbench_env(cluster, "bench_pub"), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"pg_recvlogical failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"calls": 1}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--max-changes", type=int, default=100_000, help="upto_nchanges of each SQL call (the capture's)")
    p.add_argument("--fetch-rows", type=int, default=10_000)
    p.add_argument("--bin-dir", type=Path, help="the server's binaries (default: embedded PostgreSQL 18)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "slot-read.json")
    args = p.parse_args(argv)
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalPostgres.start(bin_dir=args.bin_dir))
        stack.enter_context(tempfile.TemporaryDirectory())
        create_database(cluster.dsn(), "bench_pub")
        pub = cluster.dsn("bench_pub")
        publisher_setup(cluster, "bench_pub", args.scale)
        with psycopg.connect(pub, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SOURCE,))
        bench = pgbench_figures(pgbench(cluster, "bench_pub", "-n", "-c", "4", "-j", "2", "-T", str(args.seconds)))
        target = current_lsn(pub)
        backlog = slot_behind(pub, SOURCE, target)
        print(f"PostgreSQL {server_version(cluster)}: {bench['transactions']:,} pgbench transactions, "
              f"{backlog / 2**20:,.0f} MiB of WAL; load average {load_average()}", flush=True)
        results = {}
        for method in ("streaming", "sql-batches", "sql-once"):
            slot = f"bench_read_{method.replace('-', '_')}"
            copy_slot(pub, slot)
            load = load_average()
            began = time.monotonic()
            with CpuMeter() as cpu:
                if method == "sql-batches":
                    r = sql_batches(pub, slot, target, args.max_changes, args.fetch_rows)
                elif method == "sql-once":
                    r = sql_once(pub, slot)
                else:
                    r = streaming(cluster, slot, target)
            r.update(seconds=time.monotonic() - began, cpu_seconds=cpu.seconds, load_average=load)
            drop_slot(pub, slot)
            results[method] = r
            print(f"{method:12} {r['seconds']:7.2f} s, {r['cpu_seconds']:5.1f} core-seconds, {r['calls']} call(s)"
                  + (f", {r['rows']:,} rows, {r['bytes'] / 2**20:,.1f} MiB" if "rows" in r else "")
                  + f"; load average {load}", flush=True)
    out = {"scale": args.scale, "seconds": args.seconds, "max_changes": args.max_changes,
           "pgbench_transactions": bench["transactions"], "backlog_wal_bytes": backlog, "results": results,
           "postgres": server_version(cluster), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M")}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
