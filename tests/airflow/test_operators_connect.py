"""The operators with a ``spark_connect`` connection: the job as a Spark Connect client, no spark-submit.

The copy is executed for real against the run's local Connect server: its tasks run on the server's
executors. The token of the connection goes by environment only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import psycopg
import pytest

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator
from airflow_provider_rowfilter.operators.snapshot_copy import SnapshotCopyOperator
from tests.airflow.operator_databases import PUB_PASSWORD, SUB_PASSWORD, Databases, operator_databases

TOKEN = "tok-Vq93LmX2-connect"


@pytest.fixture
def dbs(fresh_db: Callable[..., str], airflow_conn: Callable[..., str], password_roles: Any) -> Databases:
    """A publisher with t1, t2 and publications p1 (filtered), p2; an empty subscriber; connections
    (tests/airflow/operator_databases.py), as the run's password roles."""
    return operator_databases(fresh_db, airflow_conn)


def _spec_from(command: list[str]) -> SubscriptionSpec:
    return SubscriptionSpec.from_json(command[command.index("--spec-json") + 1])


def _connect_conn(airflow_conn: Callable[..., str], url: str, **extra: str) -> str:
    address = urlparse(url.replace("sc://", "http://", 1))
    return airflow_conn({"conn_type": "spark_connect", "host": address.hostname, "port": address.port, **extra},
                        "connect")


def test_a_copy_through_a_spark_connect_connection(dbs: Databases, airflow_conn: Callable[..., str],
                                                   spark_connect_url: str, caplog: pytest.LogCaptureFixture,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    conn_id = _connect_conn(airflow_conn, spark_connect_url)
    common = {"subscription": "s_connect", "publications": ["p1", "p2"], "publisher_conn_id": dbs.pub_conn,
              "subscriber_conn_id": dbs.sub_conn, "conn_id": conn_id}
    with psycopg.connect(dbs.sub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (a int PRIMARY KEY, b text); CREATE TABLE t2 (id int PRIMARY KEY, region text)")
    RefreshPublicationOperator(task_id="refresh", **common).execute({})
    op = SnapshotCopyOperator(task_id="copy", **common)

    result = op.execute({})

    assert {t["table"]: (t["state"], t["rows_copied"]) for t in result["tables"]} == {
        "public.t1": ("f", 4), "public.t2": ("f", 0)}, result
    with psycopg.connect(dbs.sub) as conn:
        assert conn.execute("SELECT a FROM t1 ORDER BY a").fetchall() == [(3,), (4,), (5,), (6,)]
    out, err = capfd.readouterr()
    logs = "\n".join(r.getMessage() for r in caplog.records) + out + err
    assert "as a Spark Connect client of " + spark_connect_url in logs
    assert "Spark-Submit cmd" not in logs
    for secret in (PUB_PASSWORD, SUB_PASSWORD):
        assert secret not in logs


def test_the_token_goes_by_environment_only(dbs: Databases, airflow_conn: Callable[..., str]) -> None:
    conn_id = _connect_conn(airflow_conn, "sc://spark.example:15002", password=TOKEN, login="etl",
                            extra='{"use_ssl": true}')
    op = SnapshotCopyOperator(task_id="copy", subscription="s1", publications=["p1"], publisher_conn_id=dbs.pub_conn,
                              subscriber_conn_id=dbs.sub_conn, conn_id=conn_id)
    resolved, command, env = op.prepare_connect()
    assert command[1:3] == ["-m", "airflow_provider_rowfilter.jobs.snapshot"]
    assert _spec_from(command).spark_remote == "sc://spark.example:15002/;user_id=etl;use_ssl=True"
    assert env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] == TOKEN
    assert (env["ROWFILTER_PUBLISHER_PASSWORD"], env["ROWFILTER_SUBSCRIBER_PASSWORD"]) == (PUB_PASSWORD, SUB_PASSWORD)
    for secret in (TOKEN, PUB_PASSWORD, SUB_PASSWORD):
        assert secret not in " ".join(command)


def test_spark_submit_settings_with_a_connect_connection_are_named_and_not_used(
        dbs: Databases, airflow_conn: Callable[..., str], caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    # The example DAGs pass conf={"spark.ui.enabled": "false"}: switching spark_default to a spark_connect
    # connection must keep them running, and say that the setting does nothing there.
    conn_id = _connect_conn(airflow_conn, "sc://127.0.0.1:15002")
    op = SnapshotCopyOperator(task_id="copy", subscription="s1", publications=["p1"], publisher_conn_id=dbs.pub_conn,
                              subscriber_conn_id=dbs.sub_conn, conn_id=conn_id, conf={"spark.executor.memory": "2g"})
    _, command, _ = op.prepare_connect()
    assert "spark.executor.memory" not in " ".join(command)
    out, err = capfd.readouterr()
    logs = "\n".join(r.getMessage() for r in caplog.records) + out + err
    assert "conf=['spark.executor.memory']: spark-submit settings, not used" in logs


def test_the_token_leaves_the_connection_s_url_and_the_rest_stays() -> None:
    from airflow_provider_rowfilter.hooks.job_output import connect_url

    assert connect_url("sc://h:15002/;use_ssl=true;token=a%3Db;user_id=etl") == (
        "sc://h:15002/;use_ssl=true;user_id=etl", "a=b")
    assert connect_url("sc://h:15002/") == ("sc://h:15002/", None)
