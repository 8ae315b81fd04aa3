"""The subscriber's side of one large batch alone: its statements timed one by one, on a table of pgbench's shape.

No publisher, no capture: ``--rows`` change-log rows are made here (an UPDATE of every row of a table like
``pgbench_accounts``: ``aid`` its key, every column sent; or ``--workload insert``: new keys), reduced by the
job's own reducer (flows/apply/arrow_fold.py), then written by the batch transaction's code
(flows/apply/batch_transaction.py ``commit_batch``'s stage and keys, ``StagedTable.apply``) inside a transaction that is
rolled back, ``--repeat`` times, each statement's seconds printed (``--explain``: with its EXPLAIN ANALYZE; the
COPYs, not statements of ``execute``, are the rest of each run's total).
The publisher's own ``UPDATE`` of the same rows is timed in the same run, as the yardstick. Not part of the
test suite.

    python bench/subscriber_apply.py --rows 300000

Each repeat runs the batch applied by one UPDATE straight from its rows (subscriber/direct_update.py; ``direct``),
through the keys table written once (subscriber/typed_keys.py; ``keys once``), and the way before that (the rows
COPYed into the transaction's stage as text, then read into the keys table), one after the other; each with the
seconds and the CPU seconds of the subscriber's backend (the CPU is what a loaded machine changes least).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_provider_rowfilter.core.apply.plan import PASS_THROUGH, ApplyPlan, TargetPlan  # noqa: E402
from airflow_provider_rowfilter.core.relation import TableName  # noqa: E402
from airflow_provider_rowfilter.flows.apply import arrow_fold  # noqa: E402
from airflow_provider_rowfilter.subscriber import apply_stage, direct_update, typed_keys  # noqa: E402
from airflow_provider_rowfilter.subscriber.apply_target import StagedTable, read_target  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402

TABLE = TableName("public", "accounts")
COLUMNS = ("aid", "bid", "abalance", "filler")
#: The subscriber's side now (one UPDATE straight from the rows: subscriber/direct_update.py), through the keys table
#: written once (before direct_update.DIRECT_UPDATE), and the rows staged then read again (before typed_keys.py).
MODES = ("direct", "keys once", "before")
FILLER = " " * 84


def segment(rows: int, workload: str) -> pa.Table:
    """One transaction's change-log rows: an UPDATE of keys 1..rows (every column sent), or INSERTs of new keys."""
    first = 1 if workload == "update" else rows + 1
    aid = np.arange(first, first + rows)
    text = [pa.array(aid.astype(str)), pa.array((aid // 100_000 + 1).astype(str)), pa.array(np.full(rows, "7")),
            pa.array(np.full(rows, FILLER, dtype=object), pa.string())]
    values = pa.ListArray.from_arrays(pa.array(np.arange(0, 4 * rows + 1, 4, dtype=np.int32)), _interleave(text))
    kind = "update" if workload == "update" else "insert"
    n = rows
    return pa.table({
        "commit_lsn": pa.array(np.full(n, 1000, np.int64)), "seq": pa.array(np.arange(n, dtype=np.int32)),
        "lsn": pa.array(np.arange(n, dtype=np.int64) + 1000), "xid": pa.array(np.full(n, 100, np.int64)),
        "kind": pa.array([kind] * n), "schema": pa.array(["public"] * n), "table": pa.array(["accounts"] * n),
        "replica_identity": pa.array(["d"] * n),
        "column_names": pa.array([list(COLUMNS)] * n, pa.list_(pa.string())),
        "new_values": values, "new_unchanged": pa.array([[False] * 4] * n, pa.list_(pa.bool_())),
        "old_kind": pa.nulls(n, pa.string()), "old_values": pa.nulls(n, pa.list_(pa.string())),
        "truncate_restart_identity": pa.nulls(n, pa.bool_()),
    })


def _interleave(columns: list[pa.Array]) -> pa.Array:
    n = len(columns[0])
    order = (np.arange(n)[:, None] + np.arange(len(columns))[None, :] * n).reshape(-1)
    return pa.concat_arrays(columns).take(pa.array(order))


class Timed:
    """Wraps a connection's ``execute``: each statement's seconds, by its first words."""

    def __init__(self, conn: psycopg.Connection, explain: bool) -> None:
        self.conn, self.explain, self.seconds, self.cpu = conn, explain, defaultdict(float), defaultdict(float)
        self.original = conn.execute
        conn.execute = self  # every statement of the code under test goes through __call__

    def __call__(self, query, params=None, **kwargs):
        text = query.as_string(self.conn) if not isinstance(query, str) else query
        name = " ".join(text.split())[:90]
        if self.explain and text.lstrip().split()[0].upper() in ("UPDATE", "INSERT", "DELETE", "SELECT"):
            with self.conn.transaction(force_rollback=True):  # the statement's plan, undone
                plan = self.original("EXPLAIN (ANALYZE, BUFFERS) " + text, params).fetchall()
            print("   " + "\n   ".join(r[0] for r in plan), flush=True)
        began, cpu = time.monotonic(), backend_cpu(self.conn)
        try:
            return self.original(query, params, **kwargs)
        finally:
            self.seconds[name] += time.monotonic() - began
            self.cpu[name] += backend_cpu(self.conn) - cpu


def backend_cpu(conn: psycopg.Connection) -> float:
    """The CPU seconds the connection's backend has used (less sensitive than wall time to a loaded machine)."""
    fields = Path(f"/proc/{conn.info.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--workload", choices=("update", "insert"), default="update")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--explain", action="store_true", help="print each statement's EXPLAIN ANALYZE (runs it twice)")
    p.add_argument("--out", type=Path)
    p.add_argument("--show", type=int, default=6, help="how many of the slowest statements to print per run")
    p.add_argument("--options", default="", help="the subscriber connection's libpq options, e.g. '-c work_mem=64MB'")
    args = p.parse_args(argv)
    with LocalPostgres.start() as cluster:
        dsn = cluster.create_database("bench_sub")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("CREATE SCHEMA rowfilter")
            conn.execute(apply_stage.stage_ddl())
            conn.execute("CREATE TABLE accounts (aid integer PRIMARY KEY, bid integer, abalance integer, "
                         "filler character(84))")
            conn.execute("INSERT INTO accounts SELECT g, g / 100000 + 1, 0, '' FROM generate_series(1, %s) g",
                         (args.rows,))
            conn.execute("VACUUM ANALYZE accounts")
            began, cpu = time.monotonic(), backend_cpu(conn)
            conn.execute("BEGIN")
            conn.execute("UPDATE accounts SET abalance = 7")
            own, own_cpu = time.monotonic() - began, backend_cpu(conn) - cpu
            conn.execute("ROLLBACK")
            conn.execute("VACUUM accounts")
            print(f"the table's own UPDATE of {args.rows:,} rows: {own:.2f} s (CPU {own_cpu:.2f} s)", flush=True)
            target = read_target(conn, TABLE, 0)
        plan = ApplyPlan((0,), (TargetPlan(0, TABLE, (TABLE,), 0, target.column_names, target.key, (PASS_THROUGH,)),),
                         None, "error")
        began = time.monotonic()
        facts, rows = arrow_fold.reduce_columns([segment(args.rows, args.workload)], plan, "bench:1", fold_limit=0)
        print(f"reduced on the columns: {time.monotonic() - began:.2f} s, {rows.num_rows:,} staged rows", flush=True)
        runs = []
        for attempt in range(args.repeat):
            for mode in MODES:  # interleaved: the same machine's minute for each
                typed_keys.WRITE_KEYS_ONCE = mode != "before"
                direct_update.DIRECT_UPDATE = mode == "direct"
                with psycopg.connect(dsn, options=args.options) as conn:
                    timed = Timed(conn, args.explain and attempt == 0)
                    began, cpu, ours = time.monotonic(), backend_cpu(conn), time.process_time()
                    table = StagedTable(conn, "bench:1", target, "error", None, None, 0, apply_stage.STAGE)
                    table.stage, key_rows = typed_keys.stage_rows(conn, rows)  # as flows/apply/batch_transaction.py does
                    table.rows = key_rows.get(0)
                    staged = time.monotonic() - began
                    counts = table.apply()
                    total, total_cpu = time.monotonic() - began, backend_cpu(conn) - cpu
                    job_cpu = time.process_time() - ours
                    conn.rollback()
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("VACUUM accounts")
                runs.append({"mode": mode, "total": total, "stage": staged, "counts": counts.as_dict(),
                             "statements": dict(timed.seconds), "cpu": total_cpu, "job_cpu": job_cpu,
                             "statements_cpu": dict(timed.cpu),
                             "load": os.getloadavg()[0]})
                print(f"run {attempt + 1}, {mode}: {total:.2f} s (stage {staged:.2f} s; CPU: the backend's "
                      f"{total_cpu:.2f} s, this process's {job_cpu:.2f} s) {counts.as_dict()}, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
                for name, seconds in sorted(timed.seconds.items(), key=lambda s: -s[1])[:args.show]:
                    print(f"  {seconds:6.2f} s (CPU {timed.cpu[name]:5.2f} s)  {name}", flush=True)
        for mode in MODES:
            best = min(r["total"] for r in runs if r["mode"] == mode)
            least = min(r["cpu"] for r in runs if r["mode"] == mode)
            job = min(r["job_cpu"] for r in runs if r["mode"] == mode)
            print(f"{mode}: fastest {best:.2f} s (CPU, least: the backend's {least:.2f} s, this process's {job:.2f} s), "
                  f"the table's own UPDATE "
                  f"{own:.2f} s (CPU {own_cpu:.2f} s): {own / best:.2f}")
        result = {"rows": args.rows, "workload": args.workload, "own_update": own, "own_update_cpu": own_cpu,
                  "runs": runs,
                  "load": os.getloadavg()}
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
