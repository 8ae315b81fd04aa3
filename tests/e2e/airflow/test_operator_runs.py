"""An apply operator's whole run in the task: refresh, copy and a batch submitted to Spark, with its XCom, asset
events, lineage, metrics and class archives, an idle run, then a conflict (the operators' unit tests are in
tests/airflow/test_operators.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator
from airflow_provider_rowfilter.operators.snapshot_copy import SnapshotCopyOperator
from tests.airflow.operator_databases import Databases, operator_databases
from tests.airflow.support import StatsdReceiver


@pytest.fixture
def dbs(fresh_db: Callable[..., str], airflow_conn: Callable[..., str], password_roles: Any) -> Databases:
    """A publisher with t1, t2 and publications p1 (filtered), p2; an empty subscriber; connections
    (tests/airflow/operator_databases.py), as the run's password roles."""
    return operator_databases(fresh_db, airflow_conn)


def test_apply_operator_runs_a_batch_and_emits_asset_events(dbs: Databases, tmp_path: Path, statsd: StatsdReceiver,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Refresh, copy, change the publisher, apply: the XCom, the asset events, the lineage, the metrics, the class
    archives; an idle run in the task; then a conflict."""
    from airflow.sdk import AssetAlias
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    with psycopg.connect(dbs.sub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (a int PRIMARY KEY, b text); CREATE TABLE t2 (id int PRIMARY KEY, region text)")
    # Judged by Spark (filtering: spark): a batch the publisher judged needs no Spark, and the task applies it itself
    # (tests/e2e/airflow/test_dags.py); here the job is submitted and its driver's JVM is looked at.
    (tmp_path / "s_batch.yaml").write_text("subscription: s_batch\npublications: [p1, p2]\nfiltering: spark\n")
    common = {"spec": str(tmp_path / "s_batch.yaml"), "subscription": "s_batch", "publications": ["p1", "p2"],
              "publisher_conn_id": dbs.pub_conn,
              "subscriber_conn_id": dbs.sub_conn, "conn_id": dbs.spark_conn, "conf": {"spark.ui.enabled": "false"}}
    archives = tmp_path / "archives"
    monkeypatch.setenv("ROWFILTER_CLASS_ARCHIVE_DIR", str(archives))
    RefreshPublicationOperator(task_id="refresh", **common).execute({})
    SnapshotCopyOperator(task_id="snapshot", **common).execute({})
    with psycopg.connect(dbs.pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (7, 'b7'), (0, 'filtered out'); UPDATE t1 SET b = 'new' WHERE a = 3;"
                     "INSERT INTO t2 VALUES (1, 'EU')")
    op = ApplyChangesOperator(task_id="apply", change_log=str(tmp_path / "log"), max_changes=1000, time_budget=240,
                              **common)
    context: dict[str, Any] = {"outlet_events": OutletEventAccessors()}
    result = op.execute(context)
    # The task looked first (no log on record here yet: nothing captured) and handed over: the job gets what the
    # task's own run left of the time budget.
    budget = float(op.application_args[op.application_args.index("--time-budget") + 1])
    assert 200 < budget < 240, op.application_args

    assert result["subscription"] == "s_batch" and result["batch_id"] is not None
    assert result["changed_tables"] == ["public.t1", "public.t2"]
    assert result["counts"]["public.t1"]["insert"] == 1 and result["counts"]["public.t1"]["update"] == 1
    # a = 0 is outside p1's filter: judged by Spark as pgoutput would, it is not applied (rows below)
    assert result["counts"]["public.t1"]["filtered"] == 1 and result["counts"]["public.t2"]["insert"] == 1
    assert {t["table"]: t["state"] for t in result["tables"]} == {"public.t1": "r", "public.t2": "r"}
    with psycopg.connect(dbs.sub) as conn:
        assert conn.execute("SELECT a, b FROM t1 ORDER BY a").fetchall() == [
            (3, "new"), (4, "b4"), (5, "b5"), (6, "b6"), (7, "b7")]
        newest = conn.execute("SELECT id, end_lsn::text, changes FROM rowfilter.batch_history "
                              "WHERE subscription = 's_batch' ORDER BY id DESC LIMIT 1").fetchone()
    assert (result["batch_id"], result["end_lsn"], result["changes"]) == newest
    assert (tmp_path / "log").is_dir()  # the change log went where the operator said
    # The driver's class archive (spark/class_archive.py): the snapshot, the first task on this disk, only made the
    # directory (a disk that lives for one task never pays for one); the apply job, which started its Spark
    # session, left its archive, nothing half-written; the refresh job, whose JVM is spark-submit's launcher,
    # never makes one.
    made = sorted(p.name.split("-")[0] + p.suffix for p in archives.iterdir())
    assert made == ["apply.jsa"], made
    sent = statsd.received()  # Airflow's metrics (operators/metrics.py)
    assert sent["airflow.rowfilter.s_batch.apply.runs"] == ["1|c"]
    assert sent["airflow.rowfilter.s_batch.apply.changes"] == [f"{result['changes']}|c"]
    assert sent["airflow.rowfilter.s_batch.public.t1.insert"] == ["1|c"]

    # One asset event per changed subscriber table, on the subscription's AssetAlias.
    info = psycopg.conninfo.conninfo_to_dict(dbs.sub)
    where = f"postgres://{info['host']}:{info['port']}/{info['dbname']}/public"
    events = context["outlet_events"][AssetAlias("rowfilter_s_batch")].asset_alias_events
    assert [(e.dest_asset_key.uri, e.extra["insert"]) for e in events] == [(f"{where}/t1", 1), (f"{where}/t2", 1)]
    assert events[0].extra["end_lsn"] == result["end_lsn"]

    # Lineage: the publisher tables read, the subscriber tables written.
    pub = psycopg.conninfo.conninfo_to_dict(dbs.pub)
    assert op.lineage_datasets() == {
        "inputs": [(f"postgres://{pub['host']}:{pub['port']}", f"{pub['dbname']}.public.{t}") for t in ("t1", "t2")],
        "outputs": [(f"postgres://{info['host']}:{info['port']}", f"{info['dbname']}.public.{t}")
                    for t in ("t1", "t2")]}
    try:
        import airflow.providers.openlineage  # noqa: F401
    except ImportError:
        assert op.get_openlineage_facets_on_complete(None) is None  # the provider is optional
    else:
        lineage = op.get_openlineage_facets_on_complete(None)
        assert [d.name for d in lineage.outputs] == [f"{info['dbname']}.public.t1", f"{info['dbname']}.public.t2"]

    # Nothing to apply (a change to a table no publication has): the task captures the slot itself, moves it on
    # and does not submit the job (issue 19: an idle run starts no JVM).
    with psycopg.connect(dbs.pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS unpublished (id int PRIMARY KEY); INSERT INTO unpublished VALUES (1)")
        flushed = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    idle = ApplyChangesOperator(task_id="apply", change_log=str(tmp_path / "log"), max_changes=1000, **common)
    quiet = idle.execute({"outlet_events": OutletEventAccessors()})
    assert idle._output is None  # spark-submit never ran (its output watcher is made with its hook)
    assert (quiet["changes"], quiet["drained"], quiet["changed_tables"]) == (0, True, [])
    assert parse_lsn(quiet["end_lsn"]) > parse_lsn(result["end_lsn"])  # the tables' positions moved past the unpublished change
    with psycopg.connect(dbs.sub, autocommit=True) as conn:
        slot = conn.execute("SELECT slot_name FROM rowfilter.subscription WHERE name = 's_batch'").fetchone()[0]
    with psycopg.connect(dbs.pub, autocommit=True) as conn:
        assert conn.execute("SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = %s",
                            (flushed, slot)).fetchone() == (True,)
    # Off, or with a change log the subscriber does not record here, the job is submitted.
    assert ApplyChangesOperator(task_id="apply", skip_when_idle=False, **common).run_in_task(idle.resolve_spec()) \
        is False
    elsewhere = ApplyChangesOperator(task_id="apply", change_log=str(tmp_path / "other"), **common)
    assert elsewhere.run_in_task(elsewhere.resolve_spec()) is False
    assert not (tmp_path / "other").exists()  # nothing was captured into it

    # A conflict (the key already in the subscriber) fails the job without retry (a new run would meet it
    # again until somebody acts), with PostgreSQL's message; nothing is applied. The task captured the two
    # INSERTs, found a change to judge and submitted the job.
    with psycopg.connect(dbs.sub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (8, 'already here')")
    with psycopg.connect(dbs.pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (8, 'b8'), (9, 'b9')")
    # This second submission of the operator maps the archive its first made: HotSpot's class-loading log names
    # it as the source of Spark's classes ("shared objects file (top)").
    loaded = tmp_path / "classes.txt"
    op.conf["spark.driver.extraJavaOptions"] = f"-Xlog:class+load=info:file={loaded} {op.conf['spark.driver.extraJavaOptions']}"
    with pytest.raises(AirflowFailException) as e:
        op.execute({"outlet_events": OutletEventAccessors()})
    sql_classes = [line for line in loaded.read_text().splitlines()
                   if " org.apache.spark.sql." in line and "$$Lambda" not in line]  # lambdas are spun at run time
    archived = sum(line.endswith("shared objects file (top)") for line in sql_classes)
    assert len(sql_classes) > 1000 and archived > 0.9 * len(sql_classes), (archived, len(sql_classes))
    assert str(e.value).startswith('table public.t1: conflict detected on relation "public.t1": conflict=insert_exists'), \
        str(e.value)
    # The HINT's command names the task's spec file: it can be pasted into a shell (issue 29 item 6).
    assert "HINT:" in str(e.value) and f"`rowfilter skip --spec {op.spec} --lsn " in str(e.value)
    with psycopg.connect(dbs.sub) as conn:
        assert conn.execute("SELECT a, b FROM t1 WHERE a >= 8 ORDER BY a").fetchall() == [(8, "already here")]
