"""Failover from Airflow (issue 46 item 3): a publisher of two servers on their own ports as one Airflow
connection, through a promotion.

Airflow's connection URI holds one host:port (two are refused, and ``h1:p1,h2:p2`` as the host becomes an
unusable bracketed URL), so the connection lists its servers in its extra ``hosts`` (hooks/rowfilter.py
``connection_hosts``), which the hook turns into libpq's multi-host URL with ``target_session_attrs=read-write``.
A PostgreSQL 18 primary and its standby (tests/e2e/jobs/ha_pair.py) on 127.0.0.1, each on its own port: the apply and
the lag check run through that connection; the primary is killed, and status still shows the standby (ready to
take over, the primary's side unknown) and does not call the slot lost; the standby is promoted; the same
connection, unchanged, reaches it, the apply goes on with nothing lost or applied twice, and the lag check knows
the standby it was told of is the publisher now.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
import yaml
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_provider_rowfilter.cli.status import status
from airflow_provider_rowfilter.connection import in_task
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.hooks.rowfilter import RowFilterHook
from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator
from airflow_provider_rowfilter.operators.subscription_lag import SubscriptionLagCheckOperator
from airflow_provider_rowfilter.publisher.capture import capture
from airflow_provider_rowfilter.publisher.readiness import readiness
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.ha_pair import (
    PUBLICATIONS,
    SUBSCRIBER_TABLES,
    TABLES,
    HaPair,
    Workload,
    create_publisher,
    execute,
    filtered_rows,
)

DB = "pub_airflow_failover"


@pytest.fixture(scope="module")
def pair() -> Iterator[HaPair]:
    built = HaPair(18)
    yield built
    built.stop()


def test_a_multi_host_connection_follows_a_promotion(pair, fresh_db, airflow_conn, tmp_path, monkeypatch, capsys):
    create_publisher(pair, DB)
    first, second = pair.primary.port, pair.standby.port
    assert first != second  # the case Airflow's URI cannot hold
    pub_conn = airflow_conn({"conn_type": "postgres", "login": "postgres", "schema": DB,
                             "extra": {"hosts": f"127.0.0.1:{first},127.0.0.1:{second}",
                                       "passfile": str(pair.passfile)}}, "ha_pub")
    standby_conn = airflow_conn({"conn_type": "postgres", "host": "127.0.0.1", "port": second, "login": "postgres",
                                 "schema": DB, "extra": {"passfile": str(pair.passfile)}}, "ha_standby")
    sub = fresh_db()
    execute(sub, SUBSCRIBER_TABLES)
    sub_conn = airflow_conn(sub, "ha_sub")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    url = RowFilterHook.endpoint(pub_conn, "publisher").url
    assert url == (f"postgresql://postgres@127.0.0.1:{first},127.0.0.1:{second}/{DB}?passfile="
                   f"{str(pair.passfile).replace('/', '%2F')}&target_session_attrs=read-write"), url
    path = tmp_path / "ha.yaml"
    path.write_text(yaml.safe_dump({"subscription": "ha", "publisher_conn_id": pub_conn, "subscriber_conn_id": sub_conn,
                                    "publications": list(PUBLICATIONS), "standbys": [standby_conn],
                                    "change_log": str(tmp_path / "changes")}))
    resolved = RowFilterHook().resolve_spec(spec=str(path))
    spec = resolved.spec
    refresh(spec)
    assert sync_tables(spec).ok
    apply(spec)
    check = SubscriptionLagCheckOperator(task_id="check_lag", subscription="ha", subscriber_conn_id=sub_conn,
                                         publisher_conn_id=pub_conn, standby_conn_ids=[standby_conn],
                                         max_retained_wal=None)
    ready = _wait_ready(pair, spec)
    assert ready.role == "standby" and ready.timeline == 1
    workload = Workload(seed=46)
    workload.run(pair.primary.dsn(DB), 40)
    operator = ApplyChangesOperator(task_id="apply", spec=str(path))
    ran = operator.execute({"outlet_events": OutletEventAccessors()})
    assert operator._output is None and ran["changes"] > 0  # applied in the task, through the two-host connection
    measured = check.execute({})
    [panel] = measured["standbys"]
    assert panel["ready"] and panel["role"] == "standby" and panel["summary"].startswith("failover ready (timeline 1")

    # The primary dies: the standby is still shown (ready: its copy of the slot is usable), nothing is called lost.
    workload.run(pair.primary.dsn(DB), 20)
    pair.kill_primary()
    capsys.readouterr()
    with in_task({}):
        assert status(spec, fmt="json") == 0
    doc = json.loads(capsys.readouterr().out)
    [shown] = doc["standbys"]
    assert shown["ready"] and shown["primary_unreachable"], shown
    assert doc["broken"] is None and "the publisher cannot be reached" in doc["warnings"][0], doc["warnings"]
    assert "refresh" not in " ".join(doc["warnings"]), doc["warnings"]  # the slot is not in question

    # Promoted: the same connection, unchanged, now reaches it; nothing lost, nothing applied twice.
    pair.promote()
    workload.run(pair.primary.dsn(DB), 20)
    again = ApplyChangesOperator(task_id="apply", spec=str(path)).execute({"outlet_events": OutletEventAccessors()})
    assert again["changes"] > 0
    for table in TABLES:
        assert table_rows(sub, table) == filtered_rows(pair.primary.dsn(DB), table), table
    measured = check.execute({})  # the standby it was told of is the publisher now: not a failure
    [panel] = measured["standbys"]
    assert panel["role"] == "promoted" and panel["is_publisher"] and panel["timeline"] == 2, panel
    assert "promoted (timeline 2): it is the publisher now" in panel["summary"]
    pair.drop_slots(DB)


def _wait_ready(pair: HaPair, spec, timeout: float = 60):
    """The standby's copy of the slot kept (no longer temporary): the primary logs a running-transactions record and
    a capture moves the slot past it, as the next applies would (tests/e2e/jobs/test_failover.py ``wait_ready``)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        execute(pair.primary.dsn(DB), "SELECT pg_log_standby_snapshot()")
        capture(spec)
        with psycopg.connect(pair.primary.dsn(DB), autocommit=True) as pub:
            [found] = readiness(pub, "rowfilter_ha", [("standby", lambda: psycopg.connect(
                pair.standby.dsn(DB), autocommit=True))])
        if found.ready:
            return found
        assert time.monotonic() < deadline, found.problems
        time.sleep(0.2)


def test_the_extra_hosts_are_read_as_libpq_reads_them(airflow_conn):
    from airflow_provider_rowfilter.core.errors import SpecError

    def url(extra: dict, **conn) -> str:
        return RowFilterHook.endpoint(airflow_conn({"conn_type": "postgres", "login": "u", "schema": "app",
                                                    "extra": extra, **conn}), "publisher").url

    assert url({"hosts": ["db1:5432", "[::1]:5433"]}) == \
        "postgresql://u@db1:5432,[::1]:5433/app?target_session_attrs=read-write"
    assert url({"hosts": "db1,db2", "ports": "5432,5433", "target_session_attrs": "primary"}) == \
        "postgresql://u@db1:5432,db2:5433/app?target_session_attrs=primary"
    assert url({"hosts": "db1,db2"}, host="db1", port=6432) == \
        "postgresql://u@db1:6432,db2:6432/app?target_session_attrs=read-write"
    assert url({}, host="db1", port=5432) == "postgresql://u@db1:5432/app"
    with pytest.raises(SpecError, match="extra ports lists 3 ports for 2 hosts"):
        url({"hosts": "db1,db2", "ports": "1,2,3"})
    with pytest.raises(SpecError, match="sets host 'db9' and extra hosts 'db1,db2', which does not start with it"):
        url({"hosts": "db1,db2"}, host="db9")
    with pytest.raises(SpecError, match="is not a list of servers"):
        url({"hosts": {"db1": 1}})
