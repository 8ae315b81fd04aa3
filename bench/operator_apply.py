"""100 changes through ``ApplyChangesOperator`` under ``dag.test()``, through spark-submit and through a
warm Spark Connect server: the task's own duration, as Airflow records it. Not part of the test suite.

The example DAGs (``dags/``) run as the demo runs them (tooling/demo/dag_runner.py: one interpreter
running ``dag.test()`` for each run, an sqlite metadata database): ``rowfilter_initial_sync`` once, then
``rowfilter_incremental_sync`` ``--runs`` times with ``--changes`` changes made on the publisher before
each (INSERTs, UPDATEs in and out of the filter, DELETEs; bench/connect_apply.py), then once with
nothing to apply. One table ``t (id bigint PK, region text, n int)`` published ``WHERE (region = 'NSW')``
on a throwaway local PostgreSQL. Modes, each with its own subscription and subscriber database:

- ``spark-submit``: ``spark_default`` is a ``spark`` connection, ``local[2]``: each task runs spark-submit
  (a JVM per run, the operator's path for clusters without Connect), its driver mapping the class
  archive the first job of its kind made (spark/class_archive.py; a directory of this run's own);
- ``spark-submit, no class archive``: the same with ``ROWFILTER_CLASS_ARCHIVE_DIR=off``;
- ``connect``: ``spark_default`` is a ``spark_connect`` connection to a local server started once
  before the runs (``rowfilter spark-server``); the first incremental run meets a server that has
  only run the copy.

    python bench/operator_apply.py [--runs 5] [--changes 100] [--modes connect]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from connect_apply import CONF, changes  # noqa: E402

from airflow_provider_rowfilter.spark import connect_server  # noqa: E402
from airflow_provider_rowfilter.tooling.demo.dag_runner import airflow_home, run_dags  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402


def run_mode(mode: str, pg: LocalPostgres, pub: str, spark: dict, workdir: Path, runs: int, count: int,
             first_round: int, archives: str) -> dict[str, list[float]]:
    name = "".join(c if c.isalnum() else "_" for c in mode)
    sub = pg.create_database(f"bench_{name}")
    with psycopg.connect(sub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, region text, n int)")
    env = airflow_home(workdir / f"airflow-{name}")
    connections = {"AIRFLOW_CONN_ROWFILTER_PUBLISHER": pub, "AIRFLOW_CONN_ROWFILTER_SUBSCRIBER": sub,
                   "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark), "ROWFILTER_CLASS_ARCHIVE_DIR": archives}
    params = {"subscription": f"bench_{name}", "publications": ["p"]}
    dag_runs = [("rowfilter_initial_sync", {**params, "tables": None})]
    dag_runs += [("rowfilter_incremental_sync", params)] * (runs + 1)
    made = [0]

    def between(result: dict) -> None:
        if result["state"] != "success":
            raise SystemExit(f"{mode}: {result['dag_id']} {result['state']}: {result['tasks']}")
        if made[0] < runs:  # the last run finds nothing to apply
            changes(pub, count, first_round + made[0])
            made[0] += 1

    results = run_dags(env, dag_runs, env=connections, pools={"rowfilter_copies": 2}, timeout=3600, between=between)
    if results[-1]["state"] != "success":
        raise SystemExit(f"{mode}: the last run {results[-1]['state']}: {results[-1]['tasks']}")
    applied = [r["xcoms"]["apply"]["changes"] for r in results[1:]]
    durations = [r["durations"]["apply"] for r in results[1:]]
    print(mode, "changes", applied, "apply task seconds", [round(d, 2) for d in durations], flush=True)
    return {"runs": durations[:-1], "empty": durations[-1:], "changes": applied}


def run_connect(pg: LocalPostgres, pub: str, workdir: Path, runs: int, count: int) -> dict[str, list[float]]:
    state = workdir / "spark-server"
    began = time.monotonic()
    server = connect_server.start(state, port=15435, master="local[2]", conf=CONF)
    print(f"Spark Connect server started in {time.monotonic() - began:.1f} s ({server.url})", flush=True)
    try:
        port = int(server.url.rsplit(":", 1)[1])
        return run_mode("connect", pg, pub, {"conn_type": "spark_connect", "host": "127.0.0.1", "port": port},
                        workdir, runs, count, 100, "off")
    finally:
        connect_server.stop(state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--modes", default="spark-submit,spark-submit, no class archive,connect",
                        help="which of the modes to run (comma-separated; default all three)")
    args = parser.parse_args()
    modes = set(args.modes.split(","))
    workdir = Path(tempfile.mkdtemp(prefix="rowfilter-bench-operator-"))
    figures: dict[str, dict] = {}
    with LocalPostgres.start() as pg:
        pub = pg.create_database("bench_pub")
        with psycopg.connect(pub, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, region text, n int); "
                         "INSERT INTO t SELECT g, CASE WHEN g % 2 = 0 THEN 'NSW' ELSE 'VIC' END, g "
                         "FROM generate_series(1, 10000) g; ALTER TABLE t REPLICA IDENTITY FULL; "
                         "CREATE PUBLICATION p FOR TABLE t WHERE (region = 'NSW')")
        local = {"conn_type": "spark", "host": "local[2]"}
        if "spark-submit" in modes:
            figures["spark-submit"] = run_mode("spark-submit", pg, pub, local, workdir, args.runs, args.changes, 0,
                                               str(workdir / "class-archives"))
        if "spark-submit, no class archive" in modes:
            figures["spark-submit, no class archive"] = run_mode("spark-submit, no class archive", pg, pub, local,
                                                                 workdir, args.runs, args.changes, 200, "off")
        if "connect" in modes:
            figures["connect"] = run_connect(pg, pub, workdir, args.runs, args.changes)
    print(f"\nApplyChangesOperator task seconds under dag.test(), {args.changes} changes per run:")
    print("| mode | first run | median of the others | min | nothing to apply |")
    print("| --- | --- | --- | --- | --- |")
    for mode, f in figures.items():
        rest = f["runs"][1:] or f["runs"]
        print(f"| {mode} | {f['runs'][0]:.2f} | {statistics.median(rest):.2f} | {min(rest):.2f} | {f['empty'][0]:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "changes": args.changes, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
