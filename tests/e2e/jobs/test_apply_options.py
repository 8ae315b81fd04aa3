"""ApplyChanges' options beside PostgreSQL's own apply: SKIP by LSN, the conflict policies, columns added later.

Each case runs ApplyChanges in this process (the session's Spark) against a publisher that a NATIVE
subscription (in its own database) also replicates, so that PostgreSQL is the referee wherever it
can be: where we deliberately differ from it (a skipped transaction, last-writer-wins), the expected
rows are derived from the native subscriber's rows with the exact difference spelled out.

- ``rowfilter skip --lsn`` (ALTER SUBSCRIPTION … SKIP, worker.c maybe_start_skipping_changes): the
  conflicting remote transaction is dropped whole, later ones are applied, the skip LSN is cleared; an LSN below the
  applied position is refused; an LSN no transaction finishes at is cleared without skipping.
- ``conflict_policy``: ``error`` stops at a duplicate key (test_apply_faults covers that end to end)
  and skips UPDATE/DELETE of a missing row, counted (worker.c
  apply_handle_update_internal); ``upsert`` overwrites the
  subscriber's row, inserts the row an UPDATE did not find, and still skips and counts DELETEs.
- A column added on the publisher (no column list): replicated when the subscriber has it; refused,
  naming table and column, with nothing applied when it does not; applied once it is added.
"""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from psycopg.rows import dict_row

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.subscriber.apply_target import ApplyTargetError, ConflictError
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.apply_scenario import (
    PUBLICATIONS,
    SUBSCRIBER,
    TABLES,
    positions,
    publish,
    publisher_sql,
    subscription,
    wal_lsn,
    write_spec,
)
from tests.e2e.jobs.databases import Databases, run_ours

PUBLISHER = publisher_sql(60, 90)


def ours(dbs: Databases) -> dict[str, list[str]]:
    return {t: table_rows(dbs.ours, t) for t in TABLES}


def stats(dbs: Databases, spec: SubscriptionSpec) -> dict:
    """Our running conflict counts, as rowfilter.subscription_stats shows them (pg_stat_subscription_stats')."""
    with psycopg.connect(dbs.ours, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute("SELECT * FROM rowfilter.subscription_stats WHERE subname = %s",
                            (spec.subscription,)).fetchone()


def native_stats(dbs: Databases, name: str) -> dict:
    """pg_stat_subscription_stats' conflict counts of the native subscription (PostgreSQL 18)."""
    with psycopg.connect(dbs.native, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM pg_stat_subscription_stats WHERE subname = %s", (name,)).fetchone()
    return {k: v for k, v in row.items() if k.startswith("confl_")}


def wait_native_error_count(dbs: Databases, name: str, timeout: float = 60) -> int:
    """The native subscription's apply_error_count, once it counted one (flushed lazily, as its conflicts)."""
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(dbs.native, autocommit=True) as conn:
            (n,) = conn.execute("SELECT apply_error_count FROM pg_stat_subscription_stats WHERE subname = %s",
                                (name,)).fetchone()
        if n or time.monotonic() > deadline:
            return n
        time.sleep(0.2)


def wait_native_stats(dbs: Databases, name: str, column: str, at_least: int = 1, timeout: float = 60) -> int:
    """Wait until the native subscription counted ``at_least`` of ``column`` (the statistics are flushed lazily)."""
    deadline = time.monotonic() + timeout
    while (n := native_stats(dbs, name)[column]) < at_least:
        assert time.monotonic() < deadline, f"{name}: {column} = {n} after {timeout} s"
        time.sleep(0.2)
    return n


def native_rows(dbs: Databases) -> dict[str, list[str]]:
    return {t: table_rows(dbs.native, t) for t in TABLES}


def last_batch(dbs: Databases, spec: SubscriptionSpec) -> tuple:
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        return conn.execute("SELECT id, counts, skipped_lsn::text FROM rowfilter.batch_history "
                            "WHERE subscription = %s ORDER BY id DESC LIMIT 1", (spec.subscription,)).fetchone()


def replaced(rows: list[str], remove: set[str], add: set[str]) -> list[str]:
    """``rows`` without ``remove`` (each must be there) and with ``add``: the exact expected difference."""
    missing = remove - set(rows)
    assert not missing, f"the referee lacks {missing}: the case does not test what it says"
    return sorted((set(rows) - remove) | add)


# --- 1a. ALTER SUBSCRIPTION … SKIP ------------------------------------------------------------------
def test_skip_lsn_drops_the_whole_conflicting_transaction_then_clears(dbs, spark, tmp_path, capsys):
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    path, spec = write_spec(dbs, tmp_path)
    run_ours(spec, spark)
    # Both subscribers already hold key 5001; the publisher inserts it in a transaction that also
    # changes rows of t and u which nothing else conflicts with.
    publish(dbs.ours, ["INSERT INTO t VALUES (5001, 0, 'local row')"])
    publish(dbs.native, ["INSERT INTO t VALUES (5001, 0, 'local row')"])
    publish(dbs.publisher, ["UPDATE t SET v = 'before the conflict' WHERE id = 1"])
    start = wal_lsn(dbs.publisher)
    publish(dbs.publisher, [
        "BEGIN; INSERT INTO t VALUES (5001, 1, 'remote row'); UPDATE t SET v = 'same transaction' WHERE id = 2; "
        # u: 31 enters the filter (n 31 → 71: INSERT), 61 stays in it (UPDATE); 500 is new.
        "UPDATE u SET n = n + 40 WHERE k IN (31, 61); INSERT INTO u VALUES (500, 'a', 500); COMMIT"])
    end = wal_lsn(dbs.publisher)
    publish(dbs.publisher, ["UPDATE t SET v = 'after the conflict' WHERE id = 3",
                            "INSERT INTO u VALUES (600, 'b', 600)"])
    before_tables, before_positions = ours(dbs), positions(dbs, spec)

    with pytest.raises(ConflictError) as caught:
        apply(spec, max_changes=1000, spark=spark)
    error = caught.value
    assert (error.kind, error.table, error.key) == ("insert_exists", "public.t", ("5001",))
    assert start <= error.commit_lsn <= end, (hex(start), hex(error.commit_lsn), hex(end))
    lsn = format_lsn(error.commit_lsn)
    text = str(error)
    assert 'conflict detected on relation "public.t": conflict=insert_exists' in text, text
    # PostgreSQL 18's DETAIL (conflict.c errdetail_apply_conflict): the index, the local row, the remote row.
    assert 'Key already exists in unique index "t_pkey", modified in transaction ' in text, text
    assert "Key (id)=(5001); existing local tuple (5001, 0, local row); remote tuple (5001, 1, remote row)." \
        in text, text
    assert f"finished at {lsn}." in text and f"rowfilter skip --lsn {lsn}" in text, text
    # Nothing applied, not even the transaction before the conflicting one; no position moved.
    assert ours(dbs) == before_tables
    assert positions(dbs, spec) == before_positions
    state = subscription(dbs, spec)
    assert state["skip_lsn"] is None and "conflict=insert_exists" in state["last_error"], state
    # Counted per attempt, as PostgreSQL 18 counts each time its apply worker stops at it; native's
    # count rises with every retry of its worker, ours with every run.
    assert stats(dbs, spec)["confl_insert_exists"] == 1
    native_count = wait_native_stats(dbs, native.name, "confl_insert_exists")
    assert native_count >= 1
    with pytest.raises(ConflictError):
        apply(spec, max_changes=1000, spark=spark)
    counted = stats(dbs, spec)
    assert counted["confl_insert_exists"] == 2
    # Each stopped run is an error of the apply, as each stop of PostgreSQL's apply worker is (apply_error_count);
    # the tables' copies and the sequences met none (PostgreSQL 19's names, and 18's sync_error_count for one release).
    assert (counted["apply_error_count"], counted["sync_table_error_count"], counted["sync_seq_error_count"],
            counted["sync_error_count"]) == (2, 0, 0, 0), counted
    assert wait_native_error_count(dbs, native.name) >= 1
    # The native subscription skips the same transaction by the LSN our error gave.
    with psycopg.connect(dbs.native, autocommit=True) as conn:
        conn.execute(f"ALTER SUBSCRIPTION {native.name} SKIP (lsn = '{format_lsn(error.commit_lsn)}')")

    assert cli.main(["skip", "--spec", str(path), "--lsn", lsn]) == 0
    assert f"finished at {lsn} will be skipped" in " ".join(capsys.readouterr().out.split())
    assert subscription(dbs, spec)["skip_lsn"] == lsn

    result = apply(spec, max_changes=1000, spark=spark)
    native.wait_caught_up()
    assert result.skipped_lsn == lsn
    # Every change of the skipped transaction is counted as skipped, per table: t 2, u 3.
    assert result.tables["public.t"].get("skipped") == 2, result.tables
    assert result.tables["public.u"].get("skipped") == 3, result.tables
    batch_id, counts, skipped_lsn = last_batch(dbs, spec)
    assert (batch_id, counts, skipped_lsn) == (result.batch_id, result.tables, lsn)
    state = subscription(dbs, spec)
    assert state["skip_lsn"] is None and state["last_error"] is None, state
    assert parse_lsn(state["applied_lsn"]) > error.commit_lsn
    assert all(s == "r" for _, _, s, _ in positions(dbs, spec))

    # Native skipped the same transaction: equal tables.
    dbs.assert_same(TABLES)
    expected = ours(dbs)
    assert '(5001,0,"local row")' in expected["t"] and "(2,2,t2)" in expected["t"]
    assert '(1,1,"before the conflict")' in expected["t"] and '(3,3,"after the conflict")' in expected["t"]
    assert "(600,b,600)" in expected["u"] and "(61,b,61)" in expected["u"]

    # ALTER SUBSCRIPTION … SKIP refuses an LSN below the position already applied.
    assert cli.main(["skip", "--spec", str(path), "--lsn", lsn]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"skip WAL location (LSN {lsn}) must be greater than origin LSN {state['applied_lsn']}" in err, err
    assert subscription(dbs, spec)["skip_lsn"] is None

    # An LSN no transaction finishes at (an odd one: WAL records start 8-byte aligned): the next
    # batch that passes it clears it and skips nothing, as PostgreSQL clears it at the next commit.
    stray = format_lsn((wal_lsn(dbs.publisher) + 1) | 1)
    assert cli.main(["skip", "--spec", str(path), "--lsn", stray]) == 0
    assert subscription(dbs, spec)["skip_lsn"] == stray
    publish(dbs.publisher, ["BEGIN; UPDATE t SET v = 'later' WHERE id IN (5, 6); DELETE FROM u WHERE k = 600; COMMIT",
                            "INSERT INTO t VALUES (7001, 1, 'later insert')"])
    result = apply(spec, max_changes=1000, spark=spark)
    native.wait_caught_up()
    assert result.skipped_lsn is None
    assert "skipped" not in result.tables["public.t"], result.tables
    assert subscription(dbs, spec)["skip_lsn"] is None
    dbs.assert_same(TABLES)
    assert '(7001,1,"later insert")' in native_rows(dbs)["t"]


# --- 1b. conflict_policy ----------------------------------------------------------------------------
MISSING_ROWS = [
    "UPDATE t SET v = 'updated' WHERE id = 5",            # t: the row is gone in the subscriber
    "DELETE FROM t WHERE id = 6",
    "UPDATE t SET id = 7001 WHERE id = 7",                # key change of a row that is gone
    "UPDATE u SET n = n + 1 WHERE k = 61",                # u (FULL): gone, then UPDATE and DELETE
    "DELETE FROM u WHERE k = 64",
    "UPDATE t SET v = 'present' WHERE id = 9",            # these find their rows
    "DELETE FROM u WHERE k = 67",
]
GONE = ["DELETE FROM t WHERE id IN (5, 6, 7)", "DELETE FROM u WHERE k IN (61, 64)"]


def test_error_policy_skips_and_counts_missing_rows_like_native(dbs, spark, tmp_path, capsys):
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    path, spec = write_spec(dbs, tmp_path, conflict_log="table")
    run_ours(spec, spark)
    publish(dbs.ours, GONE)
    publish(dbs.native, GONE)
    publish(dbs.publisher, MISSING_ROWS)
    result = apply(spec, max_changes=1000, spark=spark)
    native.wait_caught_up()
    dbs.assert_same(TABLES)
    # update_missing / delete_missing: skipped (native LOGs them), counted apart from what was applied.
    t, u = result.tables["public.t"], result.tables["public.u"]
    assert (t.get("update"), t.get("missing_update"), t.get("delete"), t.get("missing_delete")) == (1, 2, None, 1), t
    assert (u.get("update"), u.get("missing_update"), u.get("delete"), u.get("missing_delete")) == (None, 1, 1, 1), u
    assert "insert" not in t, t
    _, counts, _ = last_batch(dbs, spec)
    assert counts == result.tables
    assert "(7001,2,t7)" not in table_rows(dbs.ours, "t")
    # The running counts equal pg_stat_subscription_stats' (update_missing 3, delete_missing 2), per table too.
    wait_native_stats(dbs, native.name, "confl_delete_missing", 2)
    theirs = native_stats(dbs, native.name)
    mine = stats(dbs, spec)
    assert {k: mine[k] for k in theirs} == theirs, (mine, theirs)
    assert (mine["confl_update_missing"], mine["confl_delete_missing"]) == (3, 2), mine
    # The conflict log holds exactly the skipped changes, per key and type (their number in `changes`).
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        logged = conn.execute(
            "SELECT table_name, conflict_type, key, changes, remote_row IS NOT NULL, commit_lsn IS NOT NULL "
            "FROM rowfilter.conflict_log WHERE subscription = %s ORDER BY 1, 2, key::text",
            (spec.subscription,)).fetchall()
        per_table = dict(conn.execute(
            "SELECT table_name, confl_update_missing * 10 + confl_delete_missing FROM rowfilter.conflict_stats "
            "WHERE subscription = %s", (spec.subscription,)).fetchall())
    assert per_table == {"t": 21, "u": 11}, per_table
    assert [(t, k, key, n, remote) for t, k, key, n, remote, _ in logged] == [
        ("t", "delete_missing", {"id": "6"}, 1, False), ("t", "update_missing", {"id": "5"}, 1, True),
        ("t", "update_missing", {"id": "7"}, 1, True), ("u", "delete_missing", {"k": "64", "s": "b"}, 1, False),
        ("u", "update_missing", {"k": "61", "s": "b"}, 1, True)], logged
    # Each key's changes are one remote transaction's: it is recorded (a barrier's, or a reduced key's).
    assert all(has_lsn for *_, has_lsn in logged), logged
    # status shows them; reset-conflicts (pg_stat_reset_subscription_stats) sets them back to zero.
    assert cli.main(["status", "--spec", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["conflicts"]
    assert (doc["total"]["update_missing"], doc["tables"]["public.u"]["delete_missing"]) == (3, 1), doc
    assert cli.main(["status", "--spec", str(path)]) == 0
    assert "update_missing 3, delete_missing 2" in " ".join(capsys.readouterr().out.split())
    assert cli.main(["reset-conflicts", "--spec", str(path)]) == 0
    after = stats(dbs, spec)
    assert not any(v for k, v in after.items() if k.startswith("confl_") or k.endswith("error_count")) \
        and after["stats_reset"] is not None


def test_upsert_policy_last_writer_wins(dbs, spark, tmp_path):
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    _, spec = write_spec(dbs, tmp_path, conflict_policy="upsert")
    assert spec.conflict_policy == "upsert"
    run_ours(spec, spark)
    # Local rows the publisher will insert or move a key onto; rows the publisher will change are gone.
    publish(dbs.ours, ["INSERT INTO t VALUES (5001, 0, 'local row'), (5002, 0, 'local row 2')",
                       "INSERT INTO u VALUES (300, 'a', 0)"] + GONE)
    publish(dbs.publisher, [
        "BEGIN; INSERT INTO t VALUES (5001, 1, 'remote row'); INSERT INTO u VALUES (300, 'a', 300); COMMIT",
        "UPDATE t SET id = 5002 WHERE id = 9",            # key change onto a local row: update_exists
        *MISSING_ROWS[:5]])
    result = apply(spec, max_changes=1000, spark=spark)
    native.wait_caught_up()
    # Native never had the local rows nor lost any: it holds what last-writer-wins must reach (the
    # remote rows overwrite the local ones, an UPDATE that found no row inserts it whole, a DELETE
    # that found none leaves nothing), so it is the referee although it would stop at the conflict.
    dbs.assert_same(TABLES)
    rows_t = table_rows(dbs.ours, "t")
    assert '(5001,1,"remote row")' in rows_t and "(5002,4,t9)" in rows_t and "(7001,2,t7)" in rows_t
    assert "(5,0,updated)" in rows_t and not any(r.startswith(("(6,", "(9,")) for r in rows_t)
    assert "(300,a,300)" in table_rows(dbs.ours, "u") and "(61,b,62)" in table_rows(dbs.ours, "u")
    t, u = result.tables["public.t"], result.tables["public.u"]
    assert t.get("missing_delete") == 1 and u.get("missing_delete") == 1, result.tables
    assert "missing_update" not in t and "missing_update" not in u, result.tables
    _, counts, _ = last_batch(dbs, spec)
    assert counts == result.tables


# --- 1c. a column added on the publisher --------------------------------------------------------------
def test_column_added_on_the_publisher(dbs, spark, tmp_path):
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    _, spec = write_spec(dbs, tmp_path)
    run_ours(spec, spark)

    # The subscriber has the column first (both subscribers): it replicates like any other.
    for dsn in (dbs.native, dbs.ours):
        publish(dsn, ["ALTER TABLE t ADD COLUMN note text"])
    publish(dbs.publisher, ["ALTER TABLE t ADD COLUMN note text",
                            "INSERT INTO t VALUES (101, 1, 'new', 'with a note'), (102, 2, 'new', NULL)",
                            "UPDATE t SET note = 'noted' WHERE id IN (1, 2, 4)"])
    apply(spec, max_changes=1000, spark=spark)
    native.wait_caught_up()
    dbs.assert_same(TABLES)
    assert '(101,1,new,"with a note")' in table_rows(dbs.ours, "t")

    # Our subscriber lacks the next one (native's has it, else native would stop too).
    publish(dbs.native, ["ALTER TABLE t ADD COLUMN extra int DEFAULT 7"])
    publish(dbs.publisher, ["UPDATE t SET v = 'before extra' WHERE id = 10"])  # applies cleanly on its own
    start = wal_lsn(dbs.publisher)
    publish(dbs.publisher, ["ALTER TABLE t ADD COLUMN extra int DEFAULT 7",
                            "INSERT INTO t VALUES (103, 3, 'with extra', NULL, 42)"])
    end = wal_lsn(dbs.publisher)
    publish(dbs.publisher, ["UPDATE t SET extra = 8, v = 'extra changed' WHERE id = 11"])
    before_tables, before_positions = ours(dbs), positions(dbs, spec)
    with pytest.raises(ApplyTargetError) as caught:
        apply(spec, max_changes=1000, spark=spark)
    error = caught.value
    assert error.table == "public.t"
    assert error.message == 'logical replication target relation "public.t" is missing replicated column: "extra"'
    lsn = parse_lsn(error.detail.split("finished at ", 1)[1].split()[0])
    assert start <= lsn <= end, (hex(start), hex(lsn), hex(end))
    assert ours(dbs) == before_tables  # nothing of the batch, not even the transaction before it
    assert positions(dbs, spec) == before_positions
    assert "missing replicated column" in subscription(dbs, spec)["last_error"]

    publish(dbs.ours, ["ALTER TABLE t ADD COLUMN extra int DEFAULT 7"])
    apply(spec, max_changes=1000, spark=spark)
    native.wait_caught_up()
    dbs.assert_same(TABLES)
    rows = table_rows(dbs.ours, "t")
    assert '(103,3,"with extra",,42)' in rows and '(11,1,"extra changed",,8)' in rows
    assert '(10,0,"before extra",,7)' in rows  # sent before the column existed: the subscriber's default
    assert all(s == "r" for _, _, s, _ in positions(dbs, spec))
