"""The databases and connections of the operator tests: a publisher, an empty subscriber, Airflow connections.

Shared by tests/airflow/test_operators.py and tests/airflow/test_operators_connect.py, each of which
makes them its ``dbs`` fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

PUB_PASSWORD = "pub-Pa55word-7Hq2x"
SUB_PASSWORD = "sub-Pa55word-Lm4Zr"
PUBLISHER_SQL = """
CREATE TABLE t1 (a int PRIMARY KEY, b text);
CREATE TABLE t2 (id int PRIMARY KEY, region text);
INSERT INTO t1 SELECT g, 'b' || g FROM generate_series(1, 6) g;
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 2);
CREATE PUBLICATION p2 FOR TABLE t2;
"""


class Databases:
    def __init__(self, pub: str, sub: str, pub_conn: str, sub_conn: str, spark_conn: str) -> None:
        self.pub, self.sub = pub, sub
        self.pub_conn, self.sub_conn, self.spark_conn = pub_conn, sub_conn, spark_conn


def postgres_conn(dsn: str, password: str | None) -> dict[str, Any]:
    """An Airflow ``postgres`` connection (JSON form) to ``dsn``, with ``password`` when given."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    conn = {"conn_type": "postgres", "host": info["host"], "port": int(info["port"]), "login": info["user"],
            "schema": info["dbname"], "extra": {"sslmode": "disable", "connect_timeout": "10"}}
    if password:
        conn["password"] = password
    return conn


def operator_databases(fresh_db: Callable[..., str], airflow_conn: Callable[..., str]) -> Databases:
    """A publisher with t1, t2 and publications p1 (filtered), p2; an empty subscriber; connections.

    The cluster trusts local connections, so the passwords are accepted and ignored: these tests
    are about where the passwords travel (the DAG test proves one reaches the job and is used).
    """
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(PUBLISHER_SQL)
    return Databases(pub, sub, airflow_conn(postgres_conn(pub, PUB_PASSWORD), "pub"),
                     airflow_conn(postgres_conn(sub, SUB_PASSWORD), "sub"),
                     airflow_conn({"conn_type": "spark", "host": "local[2]"}, "spark"))
