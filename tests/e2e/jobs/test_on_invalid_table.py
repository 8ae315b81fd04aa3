"""``on_invalid_table: skip``: one refused table does not stop the others (issue 17, item 8).

The refused definition comes from a publications file (DDL): a filter the publisher never sees, which
we judge, and refuse, ourselves. The other table replicates, beside a native subscription of it.
"""

from __future__ import annotations

import json

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import REFUSED, refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.sensors.subscription_rel import SubscriptionRelSensor
from airflow_provider_rowfilter.subscriber.state import StateStore
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.databases import names

TABLES = "CREATE TABLE t_ok (id int PRIMARY KEY, v int); CREATE TABLE t_bad (id int PRIMARY KEY, name text);"
PUBLISHER = TABLES + """
INSERT INTO t_ok VALUES (1, 1), (2, -2); INSERT INTO t_bad VALUES (1, 'aa');
CREATE PUBLICATION p_ok FOR TABLE t_ok WHERE (id % 2 = 1);  -- the native referee's, for t_ok
"""
# PostgreSQL accepts this publication; a backreference in a POSIX regex is nothing Spark can judge exactly.
DDL = r"CREATE PUBLICATION p1 FOR TABLE t_ok WHERE (id % 2 = 1), t_bad WHERE (name ~ '(a)\1');"
T_OK, T_BAD = TableName("public", "t_ok"), TableName("public", "t_bad")


@pytest.fixture
def mixed(dbs, tmp_path):
    dbs.create(PUBLISHER, TABLES)
    with psycopg.connect(dbs.publisher, autocommit=True) as conn:  # the publisher itself takes the DDL
        conn.execute("BEGIN; " + DDL + " ROLLBACK;")
    (tmp_path / "publications.sql").write_text(DDL + "\n")
    name = f"mixed_{next(names)}"
    path = tmp_path / "spec.yaml"
    data = {"subscription": name, "publisher": dbs.publisher, "subscriber": dbs.ours, "publications": ["p1"],
            "publications_ddl": "publications.sql", "change_log": "changes"}
    path.write_text(yaml.safe_dump(data))
    return dbs, SubscriptionSpec.load(path), path


def states(spec: SubscriptionSpec) -> dict[TableName, tuple[SyncState, str | None]]:
    with psycopg.connect(spec.subscriber, autocommit=True) as conn:
        return {r.table: (r.state, r.last_error) for r in StateStore(conn, spec.subscription).tables()}


def test_by_default_one_refused_table_refuses_the_subscription(mixed):
    _, spec, _ = mixed
    with pytest.raises(RowFilterError, match="table public.t_bad"):
        refresh(spec)


def test_with_skip_the_other_tables_replicate_and_the_refused_one_shows_why(mixed, spark, tmp_path, capsys, caplog,
                                                                             monkeypatch):
    dbs, spec, path = mixed
    path.write_text(path.read_text() + "on_invalid_table: skip\n")
    spec = SubscriptionSpec.load(path)
    native = dbs.subscribe_native(("p_ok",))

    result = refresh(spec)
    (reason,) = result.refused.values()
    assert list(result.refused) == ["public.t_bad"] and "t_bad" in reason
    # The messages, not caplog.text: a JSON formatter a job installed on the root handlers escapes the reason's "\\1".
    logged = "\n".join(caplog.messages)
    assert "public.t_bad: refused and skipped" in logged and reason in logged  # the task log says it
    now = states(spec)
    assert now[T_OK] == (SyncState.INIT, None)
    assert now[T_BAD] == (SyncState.INIT, REFUSED + reason)

    copied = sync_tables(spec, spark=spark)
    assert copied.ok, copied.summary()  # the refused table is skipped, not failed
    assert {t.table: t.state for t in copied.tables} == {"public.t_ok": "f", "public.t_bad": "i"}

    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        conn.execute("INSERT INTO t_ok VALUES (3, 3), (4, -4); UPDATE t_ok SET v = 10 WHERE id = 1; "
                     "INSERT INTO t_bad VALUES (2, 'bb'), (3, 'aaa');")
    native.wait_caught_up()
    applied = apply(spec, spark=spark)
    assert states(spec)[T_OK][0] in (SyncState.SYNCHRONIZED, SyncState.READY), applied
    assert table_rows(dbs.ours, "t_ok") == table_rows(dbs.native, "t_ok") == ["(1,10)", "(3,3)"]
    assert table_rows(dbs.ours, "t_bad") == []  # neither copied nor applied
    assert states(spec)[T_BAD] == (SyncState.INIT, REFUSED + reason)

    # status shows the reason; the sensor fails with it for all tables and waits for the others alone.
    capsys.readouterr()
    cli.main(["status", "--spec", str(path), "--json"])
    shown = {t["table"]: t for t in json.loads(capsys.readouterr().out)["tables"]}
    assert shown["public.t_bad"]["state"] == "i" and shown["public.t_bad"]["last_error"] == REFUSED + reason
    assert shown["public.t_ok"]["last_error"] is None
    monkeypatch.setenv("AIRFLOW_CONN_RF_MIXED_SUB", dbs.ours)
    sensor = SubscriptionRelSensor(task_id="wait", subscription=spec.subscription, subscriber_conn_id="rf_mixed_sub",
                                   target_state="f", poke_interval=0.1, timeout=10)
    with pytest.raises(Exception, match="table public.t_bad: refused by refresh") as failed:
        sensor.poke({})
    assert type(failed.value).__name__ == "AirflowFailException"
    only_ok = SubscriptionRelSensor(task_id="wait_ok", subscription=spec.subscription,
                                    subscriber_conn_id="rf_mixed_sub", tables="public.t_ok", target_state="f",
                                    poke_interval=0.1, timeout=10)
    assert only_ok.poke({})

    # Fixed (a filter Spark can judge): the next refresh accepts it, clears the error, the copy takes it.
    (tmp_path / "publications.sql").write_text(
        "CREATE PUBLICATION p1 FOR TABLE t_ok WHERE (id % 2 = 1), t_bad WHERE (id <> 2);\n")
    assert refresh(spec).refused == {}
    assert states(spec)[T_BAD] == (SyncState.INIT, None)
    assert sync_tables(spec, spark=spark, tables=[T_BAD]).ok
    assert table_rows(dbs.ours, "t_bad") == ["(1,aa)", "(3,aaa)"]


def test_skip_does_not_leave_out_a_table_already_replicated(mixed, spark):
    dbs, spec, path = mixed
    ddl = path.parent / "publications.sql"
    ddl.write_text("CREATE PUBLICATION p1 FOR TABLE t_ok WHERE (id % 2 = 1), t_bad WHERE (id > 0);\n")
    path.write_text(path.read_text() + "on_invalid_table: skip\n")
    spec = SubscriptionSpec.load(path)
    refresh(spec)
    assert sync_tables(spec, spark=spark).ok
    ddl.write_text(DDL + "\n")  # t_bad, copied, becomes refused: its changes would no longer be captured
    with pytest.raises(RowFilterError, match=r"table public.t_bad is refused and already replicated \(state f\)"):
        refresh(spec)
    assert states(spec)[T_BAD] == (SyncState.FINISHED_COPY, None)  # nothing changed
