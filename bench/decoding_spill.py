"""What a large transaction's capture waits for: the slot function's decoding, spilled to disk or not.

The capture reads the slot with ``pg_logical_slot_peek_binary_changes`` (publisher/capture.py), which
decodes in the capture's own session and returns its first row only once everything it returns is
decoded. A transaction whose changes exceed ``logical_decoding_work_mem`` is spilled to disk under
``pg_replslot/`` and read back at its commit (reorderbuffer.c ``ReorderBufferSerializeTXN``). This
times the function over one transaction updating ``--rows`` rows of a pgbench-accounts-like table,
alternating the session's ``logical_decoding_work_mem`` between the given sizes, ``--repeat`` times
each: alone (counted on the server: nothing crosses the wire), then as the capture reads it (a binary
server-side cursor, 10,000 rows a fetch; the first fetch waits for the whole decoding). Not part of the
test suite.

    python bench/decoding_spill.py                          # 1,000,000 rows, 64MB against 1GB, 2 rounds
    python bench/decoding_spill.py --rows 300000 --sizes 64MB,256MB,1GB
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import psycopg
import psycopg.sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import ROOT, load_average  # noqa: E402  (bench/apply.py: the shared helpers)

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402

CHANGES = ("pg_logical_slot_peek_binary_changes('s', NULL, NULL, 'proto_version', '1', "
           "'publication_names', 'p')")
COUNT = f"SELECT count(*), sum(length(data)) FROM {CHANGES}"
FETCH = f"SELECT (lsn - '0/0'::pg_lsn)::bigint, data FROM {CHANGES}"


def fetched(dsn: str, size: str) -> tuple[float, float]:
    """Seconds to read the slot as the capture does (publisher/capture.py ``_read_slot``), and to the first fetch."""
    with psycopg.connect(dsn) as conn:
        conn.execute(psycopg.sql.SQL("SET logical_decoding_work_mem = {}").format(psycopg.sql.Literal(size)))
        began, first = time.monotonic(), None
        with conn.transaction(), conn.cursor("capture", binary=True) as cursor:
            cursor.execute(FETCH)
            while cursor.fetchmany(10_000):
                first = first or time.monotonic() - began
        return time.monotonic() - began, first or 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows the one transaction updates (default 1M)")
    p.add_argument("--sizes", default="64MB,1GB", help="logical_decoding_work_mem values to alternate")
    p.add_argument("--repeat", type=int, default=2, help="rounds over the sizes (default 2)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "decoding-spill.json")
    args = p.parse_args(argv)
    sizes = args.sizes.split(",")
    timings: dict[str, list[float]] = {s: [] for s in sizes}
    cursor: dict[str, list[tuple[float, float]]] = {s: [] for s in sizes}
    with LocalPostgres.start() as pg, psycopg.connect(pg.dsn(), autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        conn.execute("CREATE TABLE accounts (aid int PRIMARY KEY, abalance int, filler char(84))")
        conn.execute("INSERT INTO accounts SELECT g, 0, '' FROM generate_series(1, %s) g", (args.rows,))
        conn.execute("CREATE PUBLICATION p FOR TABLE accounts")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute("UPDATE accounts SET abalance = abalance + 1")
        for _ in range(args.repeat):
            for size in sizes:
                conn.execute(psycopg.sql.SQL("SET logical_decoding_work_mem = {}").format(psycopg.sql.Literal(size)))
                began = time.monotonic()
                messages, size_bytes = conn.execute(COUNT).fetchone()
                timings[size].append(time.monotonic() - began)
                cursor[size].append(fetched(pg.dsn(), size))
                print(f"logical_decoding_work_mem {size}: alone {timings[size][-1]:.2f} s, {messages:,} messages, "
                      f"{size_bytes / 2**20:,.0f} MiB; through the cursor {cursor[size][-1][0]:.2f} s (first fetch "
                      f"{cursor[size][-1][1]:.2f} s); load average {load_average()}", flush=True)
    result = {"rows": args.rows, "postgres": version, "seconds": timings, "cursor_seconds_and_first_fetch": cursor,
              "load_average": load_average(),
              "date": time.strftime("%Y-%m-%d %H:%M")}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
