"""``rowfilter verify``: a filtered table compared with its publisher at one consistent point, read-only.

A difference planted in a table of a million rows (one row changed, one missing, one extra) is found with
its keys, and an equal table reports none, on Spark's tasks; a table without a key is compared as a
multiset, one with a text key by hashed ranges; live changes on the publisher while the verify runs are
never reported as differences (both sides are held at one LSN); the result is kept for ``status``.
"""

from __future__ import annotations

import json
import threading
import time

import psycopg

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.flows.apply.drain import ApplyBusyError, apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.flows.verify import comparison
from airflow_provider_rowfilter.flows.verify.reconcile import reconcile
from airflow_provider_rowfilter.flows.verify.verify import verify
from tests.e2e.jobs.verify_scenario import execute, live_changes, spec_file

MILLION = 1_000_000


def _only(result, table: str = "public.big"):
    (check,) = [t for t in result.tables if t.table == table]
    return check


def test_a_difference_planted_in_a_million_rows_is_found_and_an_equal_table_has_none(fresh_db, tmp_path, spark,
                                                                                  monkeypatch):
    pub, sub = fresh_db(), fresh_db()
    table = "CREATE TABLE big (id bigint PRIMARY KEY, grp int, v text, at timestamptz, n numeric(12,2));"
    rows = (f"INSERT INTO big SELECT g, g % 10, 'v' || g, '2025-01-01'::timestamptz + g * interval '1 s', g / 7.0 "
            f"FROM generate_series(1, {MILLION}) g")
    execute(pub, table + rows + "; CREATE PUBLICATION pbig FOR TABLE big WHERE (grp < 8)")
    # What the copy would bring, without copying it (unlogged: the test writes no WAL for it).
    execute(sub, table.replace("CREATE TABLE", "CREATE UNLOGGED TABLE") + rows + " WHERE g % 10 < 8")
    _, spec = spec_file(tmp_path, pub, sub, ["pbig"], copy_data=False)
    refresh(spec)
    monkeypatch.setattr(comparison, "LOCAL_PAGES", 0)  # a table this size is read by Spark tasks

    equal = _only(verify(spec, spark=spark))
    assert equal.clean and (equal.publisher_rows, equal.subscriber_rows) == (800_000, 800_000), equal
    assert equal.buckets > 100 and equal.differing_buckets == 0

    execute(sub, "UPDATE big SET n = n + 0.01 WHERE id = 123456; DELETE FROM big WHERE id = 234567; "
                 "INSERT INTO big VALUES (1000003, 9, 'extra', now(), 0)")
    found = verify(spec, spark=spark)
    check = _only(found)
    assert not found.clean
    assert (check.missing, check.extra, check.different) == (1, 1, 1), check
    assert check.examples == {"missing": ["(234567)"], "extra": ["(1000003)"], "different": ["(123456)"]}
    assert check.differing_buckets == 3  # rows were read in those ranges only


def test_a_table_without_a_key_is_compared_as_a_multiset(fresh_db, tmp_path):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, "CREATE TABLE log (source text, n int); ALTER TABLE log REPLICA IDENTITY FULL; "
                 "INSERT INTO log SELECT 'a', g % 50 FROM generate_series(1, 3000) g; "  # each row 60 times
                 "CREATE PUBLICATION plog FOR TABLE log WHERE (n < 40)")
    execute(sub, "CREATE TABLE log (source text, n int)")
    _, spec = spec_file(tmp_path, pub, sub, ["plog"])
    refresh(spec)
    assert sync_tables(spec).ok
    assert _only(verify(spec), "public.log").clean

    # One copy of ('a', 3) gone, one more of ('a', 4), and a row the filter excludes.
    execute(sub, "DELETE FROM log WHERE ctid = (SELECT ctid FROM log WHERE n = 3 LIMIT 1); "
                 "INSERT INTO log VALUES ('a', 4), ('a', 45)")
    check = _only(verify(spec), "public.log")
    assert (check.missing, check.extra, check.different) == (1, 2, 0), check
    assert check.compared == "as a multiset of rows (no key)"  # hashed as records: same types, PostgreSQL 18
    assert check.examples == {"missing": ["(a,3)"], "extra": ["(a,4)", "(a,45)"]}


def test_a_text_key_is_compared_by_hashed_ranges(fresh_db, tmp_path):
    pub, sub = fresh_db(), fresh_db()
    table = "CREATE TABLE code (k text PRIMARY KEY, grp int, v text);"
    execute(pub, table + "INSERT INTO code SELECT md5(g::text), g % 3, 'v' || g FROM generate_series(1, 20000) g; "
                         "CREATE PUBLICATION pcode FOR TABLE code (k, v) WHERE (grp <> 0)")
    # v of another type here: the rows are hashed as their text forms (as COPY carries them), not as records.
    execute(sub, "CREATE TABLE code (k text PRIMARY KEY, v varchar(40), local text DEFAULT 'mine')")
    _, spec = spec_file(tmp_path, pub, sub, ["pcode"])
    refresh(spec)
    assert sync_tables(spec).ok
    assert _only(verify(spec), "public.code").clean
    # The subscriber's own column is not compared; a published one is.
    execute(sub, "UPDATE code SET local = 'other' WHERE k = md5('2'); UPDATE code SET v = 'x' WHERE k = md5('4'); "
                 "DELETE FROM code WHERE k = md5('5')")
    check = _only(verify(spec), "public.code")
    assert (check.missing, check.extra, check.different) == (1, 0, 1), check
    with psycopg.connect(pub) as conn:
        four, five = conn.execute("SELECT ROW(md5('4'))::text, ROW(md5('5'))::text").fetchone()
    assert check.examples == {"missing": [five], "different": [four]}
    assert check.compared == "by key (k), hashed as text" and check.differing_buckets == 2
    # Reconciled: the published columns as a copy brings them; the subscriber's own column kept in the rows kept,
    # its default in the row inserted.
    (done,) = reconcile(spec).tables
    assert (done.inserted, done.updated, done.deleted) == (1, 1, 0)
    assert _only(verify(spec), "public.code").clean
    with psycopg.connect(sub) as conn:
        assert conn.execute("SELECT k = md5('2'), local FROM code WHERE k IN (md5('2'), md5('5')) ORDER BY 1"
                            ).fetchall() == [(False, "mine"), (True, "other")]


def test_live_changes_and_a_running_apply_are_never_reported(fresh_db, tmp_path):
    pub, sub = fresh_db(), fresh_db()
    table = "CREATE TABLE t (id int PRIMARY KEY, grp int, v text);"
    execute(pub, table + "ALTER TABLE t REPLICA IDENTITY FULL; "
                         "INSERT INTO t SELECT g, g % 10, 'v' || g FROM generate_series(1, 5000) g; "
                         "CREATE PUBLICATION pt FOR TABLE t WHERE (grp % 2 = 0)")
    execute(sub, table)
    _, spec = spec_file(tmp_path, pub, sub, ["pt"])
    refresh(spec)
    assert sync_tables(spec).ok
    stop, applied = threading.Event(), []

    def scheduled_apply() -> None:  # the incremental DAG's runs, beside the verifies
        while not stop.is_set():
            try:
                applied.append(apply(spec, time_budget=0).batches)
            except ApplyBusyError:
                pass
            time.sleep(0.05)

    runs = threading.Thread(target=scheduled_apply, daemon=True)
    with live_changes(pub) as writer:
        runs.start()
        try:
            for _ in range(3):
                result = verify(spec)
                assert result.clean, result.summary()
                assert _only(result, "public.t").publisher_rows > 0
        finally:
            stop.set()
            runs.join(60)
    assert writer.transactions > 0 and applied


def test_status_shows_the_last_verify(fresh_db, tmp_path, capsys):
    pub, sub = fresh_db(), fresh_db()
    table = "CREATE TABLE t (id int PRIMARY KEY, grp int, v text);"
    execute(pub, table + "INSERT INTO t SELECT g, g % 10, 'v' || g FROM generate_series(1, 100) g; "
                         "CREATE PUBLICATION pt FOR TABLE t WHERE (grp < 5)")
    execute(sub, table)
    path, spec = spec_file(tmp_path, pub, sub, ["pt"])
    refresh(spec)
    assert sync_tables(spec).ok
    execute(sub, "DELETE FROM t WHERE id = 3")
    capsys.readouterr()
    assert cli.main(["verify", "--spec", str(path), "--json"]) == 1
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert printed["clean"] is False and printed["tables"][0]["examples"] == {"missing": ["(3)"]}
    assert "DIFFERENT:" in err and "rowfilter reconcile" in err
    assert cli.main(["status", "--spec", str(path), "--format", "json"]) == 0
    (t,) = json.loads(capsys.readouterr().out)["tables"]
    assert t["last_check"]["kind"] == "verify" and t["last_check"]["missing"] == 1
    assert t["last_check"]["clean"] is False and t["last_check"]["lsn"] == printed["lsn"]


def test_each_difference_is_said_once_and_a_disabled_subscription_is_named_as_such(fresh_db, tmp_path, capsys, caplog):
    """``rowfilter verify`` prints a differing table once (its paragraph; the closing error only names it). A disabled
    subscription applies nothing, so a verify cannot bring it to its point: it says so and how to enable it, and
    changes nothing; a reconcile works meanwhile, as the apply's own rule for a disabled subscription allows."""
    pub, sub = fresh_db(), fresh_db()
    execute(pub, "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t SELECT g, g FROM generate_series(1, 30) g; "
                 "CREATE PUBLICATION p FOR TABLE t WHERE (id > 3)")
    execute(sub, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    path, spec = spec_file(tmp_path, pub, sub, ["p"])
    refresh(spec)
    assert sync_tables(spec).ok
    execute(sub, "DELETE FROM t WHERE id = 10")
    capsys.readouterr()
    assert cli.main(["verify", "--spec", str(path)]) == 1
    out = capsys.readouterr()
    said = out.out + out.err + "".join(r.getMessage() for r in caplog.records if r.levelno >= 30)
    assert said.count("missing: (10)") == 1 and said.count("1 missing in 1 ranges") == 1, said
    assert "1 table(s) of subscription" in said and said.count("public.t") == 2, said  # its paragraph, the error

    assert cli.main(["disable", "--spec", str(path)]) == 0
    execute(pub, "INSERT INTO t VALUES (31, 31)")  # waiting in the slot
    capsys.readouterr()
    assert cli.main(["verify", "--spec", str(path)]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert f"ERROR: subscription '{spec.subscription}' is disabled (`rowfilter disable`): a verify cannot bring" in said
    assert "`rowfilter enable --spec …`, then run the verify again" in said, said
    assert "moved past" not in said, said
    with psycopg.connect(sub) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 26  # nothing applied or repaired
    assert reconcile(spec).ok  # the repair does not need the apply
    assert cli.main(["enable", "--spec", str(path)]) == 0
    apply(spec)
    assert verify(spec).clean
