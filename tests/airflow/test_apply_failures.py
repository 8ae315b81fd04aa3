"""Every failed apply records its error where ``status`` and the sensor see it, and exits 1 (issue 14, item 9).

Each fault is real: a publisher column type the subscriber cannot take, a change-log folder whose
parent is a regular file (chmod does not stop root), the subscriber's session terminated by
``pg_terminate_backend`` at the named fault point inside the batch's transaction. The job's entry
point runs in this process on the session's Spark; the sensor is poked against the same subscriber.
"""

from __future__ import annotations

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.flows.apply.drain import ApplyError, apply
from airflow_provider_rowfilter.jobs import apply as apply_job
from airflow_provider_rowfilter.sensors.subscription_rel import SubscriptionRelSensor
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.apply_scenario import (
    SUBSCRIBER,
    expected,
    frozen,
    publish,
    publisher_sql,
    subscription,
    table_error,
    wal_lsn,
    write_spec,
)
from tests.e2e.jobs.databases import Databases, run_ours


@pytest.fixture
def dbs(fresh_db, tmp_path):
    databases = Databases(fresh_db(), fresh_db(), fresh_db(), change_logs=tmp_path)
    databases.create(publisher_sql(60, 90), SUBSCRIBER)
    return databases


def poke(dbs: Databases, spec, airflow_conn) -> None:
    SubscriptionRelSensor(task_id="wait", subscription=spec.subscription,
                          subscriber_conn_id=airflow_conn(dbs.ours, "sub"), target_state="r").poke({})


def run_main(path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = apply_job.main(["--spec", str(path)])
    return code, " ".join(capsys.readouterr().err.split())


def test_a_value_the_subscriber_column_cannot_take(dbs, spark, tmp_path, capsys, airflow_conn):
    path, spec = write_spec(dbs, tmp_path)
    run_ours(spec, spark)
    start = wal_lsn(dbs.publisher)
    publish(dbs.publisher, ["ALTER TABLE t ALTER COLUMN grp TYPE text",
                            "INSERT INTO t VALUES (901, 'abc', 'passes the filter')"])
    before = frozen(dbs, spec)
    code, err = run_main(path, capsys)
    assert code == 1, err
    assert 'ERROR: table public.t: invalid input syntax for type integer: "abc"' in err, err
    assert 'replication target relation "public.t" column "grp"' in err, err
    assert "the publisher sends the column as text, the subscriber's column is integer" in err, err
    lsn = err.split("from the transaction finished at ", 1)[1].split()[0]
    from airflow_provider_rowfilter.core.lsn import parse_lsn

    assert parse_lsn(lsn) > start, (lsn, hex(start))
    assert frozen(dbs, spec) == before
    assert 'invalid input syntax for type integer: "abc"' in subscription(dbs, spec)["last_error"]
    assert 'column "grp"' in table_error(dbs, spec, "public.t")
    with pytest.raises(AirflowFailException, match='invalid input syntax for type integer'):
        poke(dbs, spec, airflow_conn)

    publish(dbs.ours, ["ALTER TABLE t ALTER COLUMN grp TYPE text"])
    code, err = run_main(path, capsys)
    assert code == 0, err
    assert table_rows(dbs.ours, "t") == expected(dbs, "t")
    assert subscription(dbs, spec)["last_error"] is None


def test_change_log_folder_that_cannot_be_created(dbs, spark, tmp_path, capsys, airflow_conn):
    blocker = tmp_path / "a-file"
    path, spec = write_spec(dbs, tmp_path, change_log=str(blocker / "changes"))
    run_ours(spec, spark)
    blocker.write_text("not a directory\n")
    publish(dbs.publisher, ["INSERT INTO t VALUES (902, 1, 'waits in the slot')"])
    before = frozen(dbs, spec)
    code, err = run_main(path, capsys)
    assert code == 1, err
    assert f"cannot create the change-log directory '{blocker / 'changes'}'" in err, err
    assert frozen(dbs, spec) == before
    assert "cannot create the change-log directory" in subscription(dbs, spec)["last_error"]
    with pytest.raises(AirflowFailException, match="cannot create the change-log directory"):
        poke(dbs, spec, airflow_conn)

    blocker.unlink()
    code, err = run_main(path, capsys)
    assert code == 0, err
    assert table_rows(dbs.ours, "t") == expected(dbs, "t") and '(902,1,"waits in the slot")' in expected(dbs, "t")


def test_subscriber_session_ends_mid_batch(dbs, spark, tmp_path, monkeypatch, airflow_conn):
    _, spec = write_spec(dbs, tmp_path)
    run_ours(spec, spark)
    publish(dbs.publisher, ["INSERT INTO t VALUES (903, 1, 'mid-batch')", "UPDATE u SET n = 99 WHERE k = 10"])
    before = frozen(dbs, spec)
    point = faults.point

    def terminate(name: str) -> None:
        if name == "apply-mid-transaction":
            with psycopg.connect(dbs.ours, autocommit=True) as conn:
                ended = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = %s AND pid <> pg_backend_pid()", (f"rowfilter:{spec.subscription}",)
                ).fetchall()
            assert ended == [(True,)], ended
        point(name)

    monkeypatch.setattr(faults, "point", terminate)
    with pytest.raises(ApplyError) as caught:
        apply(spec, max_changes=1000, spark=spark)
    text = str(caught.value)
    assert text.startswith("lost the connection to the database: terminating connection due to administrator "
                           "command"), text
    assert "nothing of the batch was applied" in text, text
    assert frozen(dbs, spec) == before
    assert "lost the connection" in subscription(dbs, spec)["last_error"]
    with pytest.raises(AirflowFailException, match="lost the connection"):
        poke(dbs, spec, airflow_conn)

    monkeypatch.setattr(faults, "point", point)
    apply(spec, max_changes=1000, spark=spark)
    assert table_rows(dbs.ours, "t") == expected(dbs, "t") and table_rows(dbs.ours, "u") == expected(dbs, "u")
    assert subscription(dbs, spec)["last_error"] is None
