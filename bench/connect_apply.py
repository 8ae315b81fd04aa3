"""A 100-change ApplyChanges run as Airflow runs it (a process per run): cold spark-submit-like JVM vs a warm
Spark Connect server, by phase. Not part of the test suite.

One table ``t (id bigint PK, region text, n int)`` published ``WHERE (region = 'NSW')`` on a throwaway
local PostgreSQL; refreshed and copied once. Then, ``--runs`` times per mode, ``--changes`` changes are
made (INSERTs, UPDATEs in and out of the filter, DELETEs) and one ``python -m …jobs.apply`` process
applies them; then one run with nothing to apply. Modes:

- ``cold``: the spec's ``spark_master: local[2]``: the job process starts its own JVM (what spark-submit
  does in client mode, without spark-submit's own launcher JVM, so a lower bound of the operator's path);
- ``connect``: the spec's ``spark_remote``: the job attaches to a local Spark Connect server started
  once before the runs (``rowfilter spark-server``) and warmed by the first run; each run attaches to the
  session the runs before it used (spark/session.py ``reused_session_id``);
- ``connect-new``: the same server, a new session each run (a ``session_id`` of its own in ``spark_remote``).

Phases (wall seconds, measured inside the job process by wrapping the package's functions): ``start``
(interpreter and imports until the job's Spark session is asked for), ``session`` (the session: JVM
start for ``cold``), ``plan`` (``apply_frames.decide``), ``judge`` (the first action: the batch's
facts; for a small batch the one action that also collects its staged rows, ``collected``), ``write``
(``write_stage``, or ``copy_stage_rows``: the COPY from the job's process), ``rest`` (capture,
checks, the subscriber transaction), ``total``.

    python bench/connect_apply.py [--runs 5] [--changes 100]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_provider_rowfilter.core.spec.spark_remote import SPARK_CONNECT_TOKEN_ENV  # noqa: E402
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec  # noqa: E402
from airflow_provider_rowfilter.flows.refresh import refresh  # noqa: E402
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables  # noqa: E402
from airflow_provider_rowfilter.spark import connect_server  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402

PHASES = ("start", "session", "plan", "judge", "write", "rest", "total")
CONF = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false"}

# Run inside the job process: time the package's phases, then run the job's main.
PROBE = r"""
import json, sys, time
began = float(sys.argv[1])
marks = {}
import contextlib
from airflow_provider_rowfilter.spark import session as S, apply_frames as A
def timed(name, fn):
    def run(*a, **k):
        t = time.time(); r = fn(*a, **k); marks[name] = marks.get(name, 0) + time.time() - t; return r
    return run
inner = S.job_session
@contextlib.contextmanager
def job_session(*a, **k):
    marks["start"] = time.time() - began
    t = time.time()
    with inner(*a, **k) as s:
        marks["session"] = time.time() - t
        yield s
S.job_session = job_session
A.decide = timed("plan", A.decide)
A.DecidedBatch.facts = timed("judge", A.DecidedBatch.facts)
A.DecidedBatch.collected = timed("judge", A.DecidedBatch.collected)
A.write_stage = timed("write", A.write_stage)
from airflow_provider_rowfilter.flows.apply import net_effect, reducers
from airflow_provider_rowfilter.jobs import apply
reducers.copy_stage_rows = timed("write", reducers.copy_stage_rows)
net_effect.reduce_batch = timed("judge", net_effect.reduce_batch)  # a batch the publisher judged: no Spark
code = apply.main(sys.argv[2:])
marks["total"] = time.time() - began
print("PHASES " + json.dumps(marks), file=sys.stderr)
sys.exit(code)
"""


def changes(dsn: str, count: int, round_: int) -> None:
    base = 1_000_000 * (round_ + 1)
    per = count // 4
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO t SELECT g, CASE WHEN g % 2 = 0 THEN 'NSW' ELSE 'VIC' END, g "
                     f"FROM generate_series({base}, {base + per - 1}) g")
        conn.execute(f"UPDATE t SET region = 'VIC' WHERE id IN (SELECT id FROM t WHERE region = 'NSW' "
                     f"ORDER BY id LIMIT {per})")
        conn.execute(f"UPDATE t SET region = 'NSW', n = n + 1 WHERE id IN (SELECT id FROM t WHERE region = 'VIC' "
                     f"ORDER BY id DESC LIMIT {per})")
        conn.execute(f"DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY id LIMIT {count - 3 * per})")


def remote(spec: SubscriptionSpec, url: str) -> SubscriptionSpec:
    """``spec`` through the server: only SQL settings are a client's (the others are the server's, given at start)."""
    return replace(spec, spark_remote=url, spark_conf={k: v for k, v in spec.spark_conf.items() if k.startswith("spark.sql.")})


def run_job(spec: SubscriptionSpec, workdir: Path) -> dict[str, float]:
    # A Connect session in this process (the setup's copy) marks it Connect for pyspark: not the job's business.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "SPARK_HOME", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    began = time.time()
    done = subprocess.run([sys.executable, "-c", PROBE, str(began), "--spec-json", spec.to_json()], env=env,
                          cwd=workdir, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode:
        raise SystemExit(f"the job failed:\n{done.stderr[-3000:]}")
    marks = json.loads(next(line for line in done.stderr.splitlines() if line.startswith("PHASES "))[7:])
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    marks["changes"] = summary.get("changes", 0)
    known = sum(marks.get(p, 0) for p in ("start", "session", "plan", "judge", "write"))
    marks["rest"] = marks["total"] - known
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--modes", default="cold,connect,connect-new", help="comma-separated, of cold, connect, connect-new")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rowfilter-bench-connect-"))
    with LocalPostgres.start() as pg:
        pub, sub = pg.create_database("bench_pub"), pg.create_database("bench_sub")
        with psycopg.connect(pub, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, region text, n int); "
                         "INSERT INTO t SELECT g, CASE WHEN g % 2 = 0 THEN 'NSW' ELSE 'VIC' END, g "
                         "FROM generate_series(1, 10000) g; ALTER TABLE t REPLICA IDENTITY FULL; "
                         "CREATE PUBLICATION p FOR TABLE t WHERE (region = 'NSW')")
        with psycopg.connect(sub, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, region text, n int)")
        state = workdir / "spark-server"
        began = time.monotonic()
        server = connect_server.start(state, port=15433, master="local[2]", conf=CONF)
        # Its token, for this process's copy and every job process (its state directory is not the default one).
        os.environ[SPARK_CONNECT_TOKEN_ENV] = Path(server.token_file).read_text().strip()
        print(f"Spark Connect server started in {time.monotonic() - began:.1f} s ({server.url})")
        try:
            # Judged by Spark: a batch the publisher judged (filtering: source) is reduced in the job's process.
            spec = SubscriptionSpec(subscription="bench", publisher=pub, subscriber=sub, publications=("p",),
                                    change_log=str(workdir / "changes"), spark_master="local[2]", spark_conf=CONF,
                                    filtering="spark")
            refresh(spec)
            assert sync_tables(remote(spec, server.url)).ok
            results: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes.split(",")}

            def spec_of(mode: str) -> SubscriptionSpec:
                if mode == "cold":
                    return spec
                return remote(spec, server.url if mode == "connect" else f"{server.url}/;session_id={uuid.uuid4()}")

            for round_ in range(args.runs):
                for number, mode in enumerate(results):
                    changes(pub, args.changes, len(results) * round_ + number)
                    results[mode].append(run_job(spec_of(mode), workdir))
                    print(mode, {k: round(v, 2) for k, v in results[mode][-1].items()}, flush=True)
            empty = {mode: run_job(spec_of(mode), workdir) for mode in results}
        finally:
            connect_server.stop(state)
    print(f"\nmedians of {args.runs} runs of {args.changes} changes (s); the first connect run warms the server:")
    print("| mode | " + " | ".join(PHASES) + " |")
    print("| --- |" + " --- |" * len(PHASES))
    for mode, runs in results.items():
        print(f"| {mode} | " + " | ".join(f"{statistics.median(r.get(p, 0) for r in runs):.2f}" for p in PHASES) + " |")
        print(f"| {mode} (first run) | " + " | ".join(f"{runs[0].get(p, 0):.2f}" for p in PHASES) + " |")
    for mode, marks in empty.items():
        print(f"| {mode}, nothing to apply | " + " | ".join(f"{marks.get(p, 0):.2f}" for p in PHASES) + " |")


if __name__ == "__main__":
    main()
