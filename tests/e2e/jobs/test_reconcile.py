"""``rowfilter reconcile`` beyond the referee cases: on Spark's tasks, a table without a key, what it refuses,
and the command line (``--dry-run``, ``resync --reconcile``); the counts in the batch history, not as an apply's.
"""

from __future__ import annotations

import psycopg

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.flows.verify import comparison
from airflow_provider_rowfilter.flows.verify.reconcile import reconcile
from airflow_provider_rowfilter.flows.verify.verify import verify
from airflow_provider_rowfilter.subscriber.state import StateReader
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.verify_scenario import execute, spec_file

KEYLESS = ("CREATE TABLE log (source text, n int, at date);",
           "ALTER TABLE log REPLICA IDENTITY FULL; "
           "INSERT INTO log SELECT (ARRAY['a', 'b'])[1 + g % 2], g % 300, date '2025-01-01' + g % 7 "
           "FROM generate_series(1, 12000) g; CREATE PUBLICATION plog FOR TABLE log WHERE (n < 200)")


def test_a_table_without_a_key_reconciled_by_spark_tasks(fresh_db, tmp_path, spark, monkeypatch):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, KEYLESS[0] + KEYLESS[1])
    execute(sub, KEYLESS[0])
    _, spec = spec_file(tmp_path, pub, sub, ["plog"])
    refresh(spec)
    assert sync_tables(spec).ok
    expected = table_rows(sub, "log")
    monkeypatch.setattr(comparison, "LOCAL_PAGES", 0)  # every read, match and fix a Spark task
    # Copies removed, added, and a row outside the filter.
    execute(sub, "DELETE FROM log WHERE ctid IN (SELECT ctid FROM log WHERE n = 5 LIMIT 3); "
                 "INSERT INTO log VALUES ('a', 7, '2025-01-02'), ('z', 250, '2025-01-01')")
    (check,) = verify(spec, spark=spark).tables
    assert (check.missing, check.extra, check.different) == (3, 2, 0), check
    (done,) = reconcile(spec, spark=spark, group_rows=1).tables
    assert (done.inserted, done.deleted) == (3, 2), done
    assert table_rows(sub, "log") == expected
    with psycopg.connect(sub, autocommit=True) as conn:
        kinds = conn.execute("SELECT id, kind, counts FROM rowfilter.batch_history ORDER BY id").fetchall()
        reconciles = {i: counts for i, kind, counts in kinds if kind == "reconcile"}
        assert list(reconciles.values()) == [{"public.log": {"insert": 3, "delete": 2}}]
        # The apply's readers (status, the lag check, the operators' XCom) never take a reconcile for a batch.
        reader = StateReader(conn, spec.subscription)
        assert not {b.id for b in reader.batches_after(0)} & set(reconciles)
        assert max(reconciles) == max(i for i, _, _ in kinds)
        assert reader.last_batch() is None or reader.last_batch().id not in reconciles
    assert verify(spec, spark=spark).clean


def test_what_a_reconcile_refuses_and_the_command_line(fresh_db, tmp_path, capsys):
    pub, sub = fresh_db(), fresh_db()
    table = "CREATE TABLE t (id int PRIMARY KEY, v text);"
    execute(pub, table + "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g; "
                         "CREATE PUBLICATION pa FOR TABLE t WHERE (id <= 100); "
                         "CREATE PUBLICATION pb FOR TABLE t WHERE (id > 200)")
    execute(sub, table)
    path, spec = spec_file(tmp_path, pub, sub, ["pa"])
    refresh(spec)
    (waiting,) = reconcile(spec).tables  # not copied yet: nothing to reconcile, the snapshot copies it
    assert waiting.note and "not copied yet" in waiting.note
    assert sync_tables(spec).ok
    execute(sub, "DELETE FROM t WHERE id = 7")

    capsys.readouterr()
    assert cli.main(["reconcile", "--spec", str(path), "--dry-run"]) == 0
    assert "public.t: would insert 1, update 0, delete 0" in capsys.readouterr().out
    assert cli.main(["resync", "--spec", str(path), "--table", "t", "--reconcile"]) == 0
    assert "inserted 1, updated 0, deleted 0" in capsys.readouterr().out
    assert verify(spec).clean

    # A second subscription replicating into the same table: its rows would be extra; refused, nothing changed.
    _, other = spec_file(tmp_path, pub, sub, ["pb"])
    refresh(other)
    assert sync_tables(other).ok
    before = table_rows(sub, "t")
    result = reconcile(spec)
    assert not result.ok and "replicate into this table too" in result.errors["public.t"]
    assert table_rows(sub, "t") == before
    (check,) = verify(spec).tables
    assert check.extra == 100 and check.shared_with == [other.subscription]
    assert "may be theirs" in check.describe()
