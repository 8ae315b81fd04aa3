"""The example DAGs: they import cleanly, and dag.test() runs them for real.

``dag.test()`` runs in a fresh interpreter with its own AIRFLOW_HOME and sqlite metadata database
(``airflow db migrate``), the Airflow connections given as ``AIRFLOW_CONN_*`` environment
variables, and ``spark_default`` a local master: the operators submit the packaged jobs through
pyspark's ``spark-submit``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from airflow_provider_rowfilter.pg.embedded import LocalPostgres
from tests.airflow.conftest import REPO, StateDb
from tests.airflow.dag_runner import run_dags

DAGS = REPO / "dags"
TEST_DAGS = Path(__file__).with_name("dags")
SPARK = json.dumps({"conn_type": "spark", "host": "local[2]"})


def test_dagbag_imports_the_example_dags_without_errors() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=DAGS)
    assert bag.import_errors == {}
    assert sorted(bag.dags) == ["rowfilter_initial_sync"]
    dag = bag.dags["rowfilter_initial_sync"]
    assert {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks} == {
        "refresh": ["snapshot"], "snapshot": ["wait_for_copies"], "wait_for_copies": []}
    sensor = dag.get_task("wait_for_copies")
    assert (sensor.target_state, sensor.mode) == ("f", "reschedule")
    assert dag.get_task("snapshot").application.endswith("airflow_provider_rowfilter/jobs/snapshot.py")


# --- the sensor's reschedule and deferrable modes, end to end -------------------------------------------
def test_sensor_modes_under_dag_test(airflow_db: dict[str, str], state_db: StateDb) -> None:
    """Reschedule mode and deferrable mode wait for real, then succeed; a recorded error fails the run.

    The three runs share one interpreter (each dag.test() of its own subscription) to pay Airflow's
    start-up once.
    """
    reschedule, deferrable, failing = state_db, state_db.another("s2"), state_db.another("s3")
    failing.record_error("public.t2", "copy of public.t2 failed: relation does not exist")
    moved: list[str] = []

    def on_line(line: str) -> None:
        # Move a subscription's tables only once its sensor has seen them behind: the wait is real.
        for db in (reschedule, deferrable):
            if db.subscription not in moved and f"Subscription {db.subscription}: waiting for public.t1 (i)" in line:
                db.set_states(**{"public.t1": "f", "public.t2": "r"})
                moved.append(db.subscription)

    tables = ["public.t1", "public.t2"]
    results = run_dags(
        airflow_db,
        [("rowfilter_sensor_reschedule", {"subscription": "s1", "tables": tables}),
         ("rowfilter_sensor_deferrable", {"subscription": "s2", "tables": tables}),
         ("rowfilter_sensor_reschedule", {"subscription": "s3", "tables": None})],
        dags_folder=TEST_DAGS, env={"AIRFLOW_CONN_ROWFILTER_SUBSCRIBER": state_db.dsn}, on_line=on_line)
    output = results[0]["output"]
    assert moved == ["s1", "s2"], output[-5000:]
    for result in results[:2]:
        assert result["state"] == "success", output[-5000:]
        assert result["tasks"] == {"wait": "success"}
        assert result["xcoms"]["wait"] == {"public.t1": "f", "public.t2": "r"}
    assert "Rescheduling task, marking task as UP_FOR_RESCHEDULE" in output
    assert "running trigger in line" in output
    assert (results[2]["state"], results[2]["tasks"]) == ("failed", {"wait": "failed"})
    assert "copy of public.t2 failed: relation does not exist" in output


# --- the initial-sync DAG, end to end, with PostgreSQL's own subscription as referee --------------------
PUBLICATIONS = ["p1", "p2", "p3", "p4", "p_orders"]
# The subscriber's tables, as a native subscriber needs them (the demo's publisher tables; orders is
# published through its root, so the subscriber has one plain table).
SUBSCRIBER_DDL = """
CREATE TABLE t1 (a int, b int, c text, PRIMARY KEY (a, c));
CREATE TABLE t2 (d int, e int, f int, PRIMARY KEY (d));
CREATE TABLE t3 (g int, h int, i int, PRIMARY KEY (g));
CREATE TABLE t4 (id int PRIMARY KEY, a text, b text, c text, d text, e text);
CREATE TABLE orders (id bigint, region text, amount numeric(12,2), placed date, PRIMARY KEY (id, placed));
"""
TABLES = ["t1", "t2", "t3", "t4", "orders"]
HBA_MARK = "# rowfilter test_dags: scram for the DAG test's roles\n"


def _demo_sql(name: str) -> str:
    return resources.files("airflow_provider_rowfilter.demo").joinpath(name).read_text()


class Cluster:
    """Databases and scram-authenticated roles made for one test in the shared cluster, removed after it."""

    def __init__(self, pg: LocalPostgres, tag: str) -> None:
        self.pg, self.tag = pg, tag
        self.pub_role, self.sub_role = f"rf_pub_{tag}", f"rf_sub_{tag}"
        self.pub_password, self.sub_password = f"pub-{tag}-Zq81xVw", f"sub-{tag}-Kp27mNc"
        self.pub_db, self.sub_db, self.ref_db = f"dagtest_pub_{tag}", f"dagtest_sub_{tag}", f"dagtest_ref_{tag}"
        self.hba = Path(pg.data_dir) / "pg_hba.conf"

    def url(self, db: str, role: str | None = None, password: str | None = None) -> str:
        user = role or self.pg.user
        auth = f"{quote(user)}:{quote(password)}" if password else quote(user)
        return f"postgresql://{auth}@{self.pg.host}:{self.pg.port}/{db}"

    def setup(self) -> None:
        for db in (self.pub_db, self.sub_db, self.ref_db):
            self.pg.create_database(db)
        with psycopg.connect(self.pg.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                sql.Identifier(self.pub_role), sql.Literal(self.pub_password)))
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(self.sub_role), sql.Literal(self.sub_password)))
            conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(self.pub_db), sql.Identifier(self.pub_role)))
            conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                sql.Identifier(self.sub_db), sql.Identifier(self.sub_role)))
        with psycopg.connect(self.pg.dsn(self.pub_db), autocommit=True) as conn:
            conn.execute(_demo_sql("schema.sql"))
            conn.execute(_demo_sql("publications.sql"))
            # Only a table's owner may add it to a publication (the capture publication).
            for (table,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall():
                conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(table),
                                                                          sql.Identifier(self.pub_role)))
        with psycopg.connect(self.url(self.sub_db), autocommit=True) as conn:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.sub_role)))
            conn.execute(SUBSCRIBER_DDL)
        # scram for these two roles only, ahead of the cluster's trust lines.
        self.hba.write_text(f"{HBA_MARK}host all {self.pub_role},{self.sub_role} 127.0.0.1/32 scram-sha-256\n"
                            + self.hba.read_text())
        with psycopg.connect(self.pg.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")

    def teardown(self) -> None:
        lines = self.hba.read_text().splitlines(keepends=True)
        self.hba.write_text("".join(line for line in lines if self.pub_role not in line and line != HBA_MARK))
        for db in (self.ref_db, self.sub_db, self.pub_db):
            self.pg.drop_database(db)
        with psycopg.connect(self.pg.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            for role in (self.pub_role, self.sub_role):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))

    def native_referee(self) -> None:
        """Subscribe the referee database natively to the same publications; wait until every table is ready."""
        slot = f"nat_{self.tag}"
        with psycopg.connect(self.pg.dsn(self.pub_db), autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        with psycopg.connect(self.pg.dsn(self.ref_db), autocommit=True) as conn:
            conn.execute(SUBSCRIBER_DDL)
            conn.execute(sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} "
                                 "WITH (create_slot = false, slot_name = {})").format(
                sql.Identifier(slot),
                sql.Literal(f"host={self.pg.host} port={self.pg.port} user={self.pg.user} dbname={self.pub_db}"),
                sql.SQL(", ").join(sql.Identifier(p) for p in PUBLICATIONS), sql.Literal(slot)))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                states = conn.execute("SELECT srsubstate FROM pg_subscription_rel").fetchall()
                if len(states) == len(TABLES) and all(s == "r" for (s,) in states):
                    return
                time.sleep(0.2)
            raise AssertionError(f"native subscription not ready: {states}")

    def rows(self, db: str, table: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.pg.dsn(db)) as conn:
            return sorted(conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table))).fetchall(), key=repr)


@pytest.fixture
def cluster(local_pg: LocalPostgres, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    made = Cluster(local_pg, f"{abs(hash(request.node.nodeid)) % 100000}")
    made.setup()
    try:
        yield made
    finally:
        made.teardown()


def test_initial_sync_dag_copies_the_filtered_rows(airflow_db: dict[str, str], cluster: Cluster) -> None:
    # The roles authenticate with scram: without its password a job could not connect at all.
    with pytest.raises(psycopg.OperationalError, match="password authentication failed|no password"):
        psycopg.connect(cluster.url(cluster.pub_db, cluster.pub_role)).close()
    env = {
        # Both forms Airflow reads: a URI and JSON.
        "AIRFLOW_CONN_ROWFILTER_PUBLISHER": cluster.url(cluster.pub_db, cluster.pub_role, cluster.pub_password),
        "AIRFLOW_CONN_ROWFILTER_SUBSCRIBER": json.dumps({
            "conn_type": "postgres", "host": cluster.pg.host, "port": cluster.pg.port, "login": cluster.sub_role,
            "password": cluster.sub_password, "schema": cluster.sub_db}),
        "AIRFLOW_CONN_SPARK_DEFAULT": SPARK,
    }
    began = time.monotonic()
    [result] = run_dags(airflow_db, [("rowfilter_initial_sync", {"subscription": "dagtest",
                                                                 "publications": PUBLICATIONS, "tables": None})],
                        env=env)
    elapsed = time.monotonic() - began
    output = result["output"]
    assert result["state"] == "success", output[-8000:]
    assert result["tasks"] == {"refresh": "success", "snapshot": "success", "wait_for_copies": "success"}
    # The jobs went through spark-submit, the packaged job files.
    assert "Spark-Submit cmd: spark-submit --master local[2]" in output
    assert "airflow_provider_rowfilter/jobs/refresh.py --spec-json" in output
    assert "airflow_provider_rowfilter/jobs/snapshot.py --spec-json" in output
    # XComs: what refresh added, what snapshot copied, what the sensor saw.
    qualified = sorted(f"public.{t}" for t in TABLES)
    assert result["xcoms"]["refresh"]["added"] == qualified
    snapshot = result["xcoms"]["snapshot"]
    assert [t["table"] for t in snapshot["tables"]] == qualified
    assert all(t["state"] == "f" and t["lsn"] for t in snapshot["tables"])
    assert result["xcoms"]["wait_for_copies"] == dict.fromkeys(qualified, "f")
    # No password in the output, the command lines, or the rendered fields stored in the database.
    for secret in (cluster.pub_password, cluster.sub_password):
        assert secret not in output
        assert secret not in json.dumps(result["rendered"])
    # The subscriber holds exactly what PostgreSQL's own subscription of the same publications copied.
    cluster.native_referee()
    for table in TABLES:
        ours, native = cluster.rows(cluster.sub_db, table), cluster.rows(cluster.ref_db, table)
        assert ours == native, f"{table}: ours {ours} != native {native}"
    copied = {t["table"]: t["rows_copied"] for t in snapshot["tables"]}
    assert copied == {f"public.{t}": len(cluster.rows(cluster.ref_db, t)) for t in TABLES}
    assert elapsed < 240, f"the DAG run took {elapsed:.0f} s"
