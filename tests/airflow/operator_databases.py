"""The databases and connections of the operator tests: a publisher, an empty subscriber, Airflow connections.

Shared by tests/airflow/test_operators.py and tests/airflow/test_operators_connect.py, each of which
makes them its ``dbs`` fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from tests.roles import PUBLISHER, SUBSCRIBER, PasswordRole

PUB_PASSWORD, SUB_PASSWORD = PUBLISHER.password, SUBSCRIBER.password
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


def postgres_conn(dsn: str, role: PasswordRole | None) -> dict[str, Any]:
    """An Airflow ``postgres`` connection (JSON form) to ``dsn``'s database as ``role`` with its password (else
    as the superuser, whose password the run's PGPASSFILE holds)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    conn = {"conn_type": "postgres", "host": info["host"], "port": int(info["port"]),
            "login": role.name if role else info["user"], "schema": info["dbname"],
            "extra": {"sslmode": "disable", "connect_timeout": "10"}}
    if role:
        conn["password"] = role.password
    return conn


def operator_databases(fresh_db: Callable[..., str], airflow_conn: Callable[..., str]) -> Databases:
    """A publisher with t1, t2 and publications p1 (filtered), p2; an empty subscriber; connections.

    The connections log in as the run's password roles (tests/roles.py, made by the ``password_roles``
    fixture, which the caller's fixture requests) with their passwords: a job that lost one on its way
    (environment, in the task) could not connect at all.
    """
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(PUBLISHER_SQL)
    return Databases(pub, sub, airflow_conn(postgres_conn(pub, PUBLISHER), "pub"),
                     airflow_conn(postgres_conn(sub, SUBSCRIBER), "sub"),
                     airflow_conn({"conn_type": "spark", "host": "local[2]"}, "spark"))
