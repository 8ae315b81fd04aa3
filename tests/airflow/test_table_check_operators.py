"""VerifyTablesOperator and ReconcileTablesOperator: the jobs submitted with spark-submit, their XCom and metrics.

A table of the subscription differs (rows changed in the subscriber): the verify task fails without retry,
naming the rows, and still sends the table's counts to the metrics; with ``fail_on_difference=False`` it
succeeds and its XCom says ``clean: false``. The reconcile task repairs the table in place; its XCom has the
counts, and an in-process verify then finds the table equal. The DAG factory builds the verify and reconcile
DAGs with their parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.flows.verify.verify import verify
from airflow_provider_rowfilter.operators.reconcile_tables import ReconcileTablesOperator
from airflow_provider_rowfilter.operators.verify_tables import VerifyTablesOperator
from tests.airflow.support import StatsdReceiver

PUBLISHER = """
CREATE TABLE t1 (a int PRIMARY KEY, b text);
INSERT INTO t1 SELECT g, 'b' || g FROM generate_series(1, 60) g;
CREATE PUBLICATION pv FOR TABLE t1 WHERE (a > 20);
"""


def _postgres(dsn: str) -> dict[str, Any]:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return {"conn_type": "postgres", "host": info["host"], "port": int(info["port"]), "login": info["user"],
            "schema": info["dbname"], "extra": {"sslmode": "disable"}}


def test_verify_fails_on_a_difference_and_reconcile_repairs_it(fresh_db: Callable[..., str],
                                                               airflow_conn: Callable[..., str],
                                                               statsd: StatsdReceiver) -> None:
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(PUBLISHER)
    with psycopg.connect(sub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (a int PRIMARY KEY, b text)")
    spec = SubscriptionSpec(subscription="s_check", publisher=pub, subscriber=sub, publications=("pv",))
    refresh(spec)
    assert sync_tables(spec).ok
    with psycopg.connect(sub, autocommit=True) as conn:
        conn.execute("UPDATE t1 SET b = 'x' WHERE a = 30; DELETE FROM t1 WHERE a = 40")
    common = {"subscription": "s_check", "publications": ["pv"], "conn_id": airflow_conn(
        {"conn_type": "spark", "host": "local[2]"}, "spark"), "publisher_conn_id": airflow_conn(_postgres(pub), "pub"),
        "subscriber_conn_id": airflow_conn(_postgres(sub), "sub"), "conf": {"spark.ui.enabled": "false"}}

    failing = VerifyTablesOperator(task_id="verify", tables="public.t1", **common)
    with pytest.raises(AirflowFailException) as e:
        failing.execute({})
    assert "1 missing, 1 different" in str(e.value) and "missing: (40)" in str(e.value)
    sent = statsd.received()
    assert sent["airflow.rowfilter.s_check.public.t1.verify.missing"] == ["1.0|g"]
    assert sent["airflow.rowfilter.s_check.public.t1.verify.different"] == ["1.0|g"]

    reporting = VerifyTablesOperator(task_id="verify", fail_on_difference=False, **common)
    assert reporting.job_arguments() == ["--exit-zero"]
    result = reporting.execute({})
    assert result["clean"] is False and result["not_checked"] == []
    (table,) = result["tables"]
    assert (table["table"], table["missing"], table["extra"], table["different"]) == ("public.t1", 1, 0, 1)
    assert table["examples"] == {"missing": ["(40)"], "different": ["(30)"]}

    repaired = ReconcileTablesOperator(task_id="reconcile", tables=["t1"], **common).execute({})
    (table,) = repaired["tables"]
    assert (table["kind"], table["inserted"], table["updated"], table["deleted"]) == ("reconcile", 1, 1, 0)
    assert statsd.received()["airflow.rowfilter.s_check.public.t1.reconcile.inserted"] == ["1|c"]
    assert verify(spec).clean


def test_operator_arguments() -> None:
    op = ReconcileTablesOperator(task_id="r", subscription="s", tables="a.b, c", dry_run="{{ params.dry_run }}",
                                 max_readers=4)
    op.dry_run = "True"  # as a DAG parameter renders without native rendering
    assert op.job_arguments() == ["--table", "a.b", "--table", "public.c", "--max-readers", "4", "--dry-run"]
    assert "dry_run" in op.template_fields and "tables" in op.template_fields
    assert VerifyTablesOperator(task_id="v", subscription="s").job_arguments() == []
    with pytest.raises(Exception, match="max_readers=0 is not a positive integer"):
        VerifyTablesOperator(task_id="v", subscription="s", max_readers=0).job_arguments()


def test_the_factory_builds_a_verify_and_a_reconcile_dag(tmp_path) -> None:
    from airflow_provider_rowfilter.dag_factory import build_dags

    path = tmp_path / "orders.yaml"
    path.write_text("subscription: orders\npublications: [p1]\npublisher_conn_id: pg_pub\nsubscriber_conn_id: pg_sub\n"
                    "airflow:\n  verify_schedule: '@daily'\n")
    dags = build_dags(path)
    verify_dag, reconcile_dag = dags["rowfilter_orders_verify"], dags["rowfilter_orders_reconcile_tables"]
    assert verify_dag.schedule == "@daily" and reconcile_dag.schedule is None
    task = verify_dag.get_task("verify")
    assert isinstance(task, VerifyTablesOperator) and task.spec == str(path)
    assert (task.tables, task.fail_on_difference) == ("{{ params.tables | join(',') }}", True)
    assert verify_dag.params["tables"] == []
    repair = reconcile_dag.get_task("reconcile")
    assert isinstance(repair, ReconcileTablesOperator) and repair.retries == 0
    assert (reconcile_dag.params["tables"], reconcile_dag.params["dry_run"]) == ([], False)
    path.write_text("subscription: orders\npublications: [p1]\npublisher_conn_id: pg_pub\nsubscriber_conn_id: pg_sub\n")
    assert build_dags(path)["rowfilter_orders_verify"].schedule is None  # by hand unless scheduled
