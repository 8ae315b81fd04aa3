"""Databases and scram-authenticated roles for the DAG tests, and PostgreSQL's own subscription as referee."""

from __future__ import annotations

import json
import time
from importlib import resources
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres

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


def _demo_sql(name: str) -> str:
    return resources.files("airflow_provider_rowfilter.tooling.demo").joinpath(name).read_text()


class Cluster:
    """Databases and scram-authenticated roles made for one test in the shared cluster, removed after it."""

    def __init__(self, pg: LocalPostgres, tag: str) -> None:
        self.pg, self.tag = pg, tag
        self.pub_role, self.sub_role = f"rf_pub_{tag}", f"rf_sub_{tag}"
        self.pub_password, self.sub_password = f"pub-{tag}-Zq81xVw", f"sub-{tag}-Kp27mNc"
        self.pub_db, self.sub_db, self.ref_db = f"dagtest_pub_{tag}", f"dagtest_sub_{tag}", f"dagtest_ref_{tag}"

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
        # The cluster asks every role for its password (SCRAM: tooling/embedded_auth.py).

    def teardown(self) -> None:
        for db in (self.ref_db, self.sub_db, self.pub_db):
            self.pg.drop_database(db)
        with psycopg.connect(self.pg.dsn(), autocommit=True) as conn:
            for role in (self.pub_role, self.sub_role):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))

    def native_referee(self, publications: list[str] = PUBLICATIONS, tables: list[str] = TABLES) -> None:
        """Subscribe the referee database natively to the same publications; wait until every table is ready."""
        slot = f"nat_{self.tag}"
        with psycopg.connect(self.pg.dsn(self.pub_db), autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        with psycopg.connect(self.pg.dsn(self.ref_db), autocommit=True) as conn:
            conn.execute(SUBSCRIBER_DDL)
            conn.execute(sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} "
                                 "WITH (create_slot = false, slot_name = {})").format(
                sql.Identifier(slot),
                sql.Literal(f"host={self.pg.host} port={self.pg.port} user={self.pg.user} dbname={self.pub_db} "
                            f"passfile={self.pg.passfile}"),
                sql.SQL(", ").join(sql.Identifier(p) for p in publications), sql.Literal(slot)))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                states = conn.execute("SELECT srsubstate FROM pg_subscription_rel").fetchall()
                if len(states) == len(tables) and all(s == "r" for (s,) in states):
                    return
                time.sleep(0.2)
            raise AssertionError(f"native subscription not ready: {states}")

    def airflow_env(self) -> dict[str, str]:
        """The connections the example DAGs use, as environment: the publisher as a URI, the subscriber
        as JSON (both forms Airflow reads), with the scram roles' passwords; a local Spark master."""
        return {
            "AIRFLOW_CONN_ROWFILTER_PUBLISHER": self.url(self.pub_db, self.pub_role, self.pub_password),
            "AIRFLOW_CONN_ROWFILTER_SUBSCRIBER": json.dumps({
                "conn_type": "postgres", "host": self.pg.host, "port": self.pg.port, "login": self.sub_role,
                "password": self.sub_password, "schema": self.sub_db}),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        }

    def execute(self, db: str, statements: str) -> None:
        with psycopg.connect(self.pg.dsn(db), autocommit=True) as conn:
            conn.execute(statements)

    def rows(self, db: str, table: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.pg.dsn(db)) as conn:
            return sorted(conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table))).fetchall(), key=repr)

# Changes made on the publisher after an initial sync: every operation, UPDATEs entering a filter
# (t2: e = 99 is p2's filter), a row outside every filter (t3: p3 publishes g = 10 only), a column
# outside the column list (t4: p4 publishes id, a, b, d), a partitioned root (orders, p_orders).
CHANGES = """
INSERT INTO t1 VALUES (20, 200, 'NSW'), (21, 210, 'VIC');
UPDATE t1 SET b = b + 1 WHERE a = 6;
DELETE FROM t1 WHERE a = 9;
UPDATE t2 SET e = 99 WHERE d = 4;
INSERT INTO t2 VALUES (13, 99, 39);
INSERT INTO t3 VALUES (13, 26, 39);
UPDATE t4 SET e = 'x', b = 'changed' WHERE id = 1;
DELETE FROM t4 WHERE id = 5;
INSERT INTO orders VALUES (100, 'EU', 75, '2025-03-01'), (101, 'US', 75, '2025-03-01');
"""
