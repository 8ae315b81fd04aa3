"""Subscriber tables without a key, beside PostgreSQL's own apply worker (issue 17, item 2).

PostgreSQL applies INSERTs (and TRUNCATE) to a subscriber table that has neither a primary key nor a
REPLICA IDENTITY index, one row per INSERT, duplicates included. An UPDATE or DELETE for it stops the
apply ("… has neither REPLICA IDENTITY index nor PRIMARY KEY and published relation does not have
REPLICA IDENTITY FULL": worker.c check_relation_updatable) unless the publisher's table has REPLICA
IDENTITY FULL; then each change finds one row equal to its old row on every column.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.subscriber.apply_target import ApplyTargetError
from airflow_provider_rowfilter.tooling.native import table_rows
from airflow_provider_rowfilter.tooling.pg_datadir import LOG_FILE
from tests.e2e.jobs.databases import names, run_ours

TABLES = ("h", "k")
# The subscriber's h has no key in every test; the publisher's h has one only where the test says.
SUBSCRIBER = "CREATE TABLE h (a int, v text); CREATE TABLE k (id int PRIMARY KEY, v text);"


def publish(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def rows(dsn: str) -> dict[str, list[str]]:
    return {t: table_rows(dsn, t) for t in TABLES}


def positions(dsn: str, subscription: str) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT table_name, state, lsn::text FROM rowfilter.subscription_rel "
                            "WHERE subscription = %s ORDER BY 1", (subscription,)).fetchall()


def test_keyless_table_published_insert_only_gets_every_insert_duplicates_included(dbs, spark):
    dbs.create("""CREATE TABLE h (a int, v text); CREATE TABLE k (id int PRIMARY KEY, v text);
                  INSERT INTO h VALUES (1, 'old'), (5, 'old'), (5, 'old'), (6, NULL);
                  INSERT INTO k VALUES (1, 'one');
                  CREATE PUBLICATION ph FOR TABLE h WHERE (a > 2) WITH (publish = 'insert, truncate');
                  CREATE PUBLICATION pk FOR TABLE k;""", SUBSCRIBER)
    native = dbs.subscribe_native(("ph", "pk"))
    spec = dbs.spec(("ph", "pk"), f"ours_{next(names)}")
    run_ours(spec, spark)
    batches = [
        # duplicates, filtered rows, NULLs; the keyed table changes in the same transactions
        ["INSERT INTO h VALUES (3, 'x'), (3, 'x'), (1, 'filtered'), (7, NULL), (7, NULL), (7, NULL)",
         "BEGIN; INSERT INTO k VALUES (2, 'two'); INSERT INTO h VALUES (3, 'x'); UPDATE k SET v = 'uno' WHERE id = 1;"
         " COMMIT",
         "UPDATE h SET v = 'not published' WHERE a = 5", "DELETE FROM h WHERE a = 6"],
        # a TRUNCATE between inserts: the ones before are gone, the ones after stay
        ["INSERT INTO h VALUES (8, 'before')", "TRUNCATE h", "INSERT INTO h VALUES (9, 'after'), (9, 'after')",
         "DELETE FROM k WHERE id = 2"],
    ]
    for batch in batches:
        publish(dbs.publisher, *batch)
        result = apply(spec, spark=spark)
        native.wait_caught_up()
        assert rows(dbs.ours) == rows(dbs.native)
    assert table_rows(dbs.ours, "h") == ["(9,after)", "(9,after)"]
    assert result.tables["public.h"] == {"insert": 3, "truncate": 1}  # one before the TRUNCATE
    assert result.states == {"public.h": "r", "public.k": "r"}


def native_error(local_pg, needle: str, since: int, timeout: float = 30) -> str:
    """The first line of the cluster's log past offset ``since`` that holds ``needle`` (the apply worker's ERROR)."""
    log = local_pg.data_dir / LOG_FILE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with log.open(errors="replace") as f:
            f.seek(since)
            for line in f:
                if needle in line:
                    return line.split("ERROR:", 1)[-1].strip()
        time.sleep(0.2)
    raise AssertionError(f"no {needle!r} in {log}")


def test_update_for_a_keyless_table_without_full_identity_stops_the_batch_as_native_does(dbs, spark, local_pg):
    # The publisher's h has a key (so it may publish updates); the subscriber's has none.
    dbs.create("""CREATE TABLE h (a int PRIMARY KEY, v text); CREATE TABLE k (id int PRIMARY KEY, v text);
                  INSERT INTO h VALUES (1, 'one'), (2, 'two');
                  CREATE PUBLICATION p FOR TABLE h, k;""", SUBSCRIBER)
    log_offset = (local_pg.data_dir / LOG_FILE).stat().st_size
    native = dbs.subscribe_native(("p",))
    spec = dbs.spec(("p",), f"ours_{next(names)}")
    run_ours(spec, spark)
    publish(dbs.publisher, "INSERT INTO h VALUES (3, 'three')", "INSERT INTO k VALUES (1, 'k')")
    apply(spec, spark=spark)  # inserts need no key
    native.wait_caught_up()
    assert rows(dbs.ours) == rows(dbs.native) and len(table_rows(dbs.ours, "h")) == 3
    before_rows, before_positions = rows(dbs.ours), positions(dbs.ours, spec.subscription)

    publish(dbs.publisher, "INSERT INTO k VALUES (2, 'k')", "INSERT INTO h VALUES (4, 'four')")
    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        conn.execute("UPDATE h SET v = 'changed' WHERE a = 1")
        update_lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
    publish(dbs.publisher, "DELETE FROM h WHERE a = 2", "INSERT INTO h VALUES (5, 'five')")
    with pytest.raises(ApplyTargetError) as caught:
        apply(spec, spark=spark)
    error = caught.value
    message = ('logical replication target relation "public.h" has neither REPLICA IDENTITY index nor PRIMARY KEY '
               "and published relation does not have REPLICA IDENTITY FULL")
    assert error.message == message and error.table == "public.h"
    # the first such change: the UPDATE's transaction (the DELETE's came later)
    assert 'message of type "UPDATE"' in str(error) and "rowfilter skip --lsn" in str(error), str(error)
    failed_lsn = str(error).split("finished at ")[1].split(" ")[0]
    assert psycopg.connect(dbs.publisher).execute("SELECT %s::pg_lsn <= %s::pg_lsn", (failed_lsn, update_lsn)
                                                  ).fetchone()[0]
    # Nothing applied (not the inserts before the UPDATE, not the keyed table), no position moved, recorded.
    assert rows(dbs.ours) == before_rows and positions(dbs.ours, spec.subscription) == before_positions
    with psycopg.connect(dbs.ours) as conn:
        assert message in conn.execute("SELECT last_error FROM rowfilter.subscription WHERE name = %s",
                                        (spec.subscription,)).fetchone()[0]
    # PostgreSQL's apply worker stops at the same change with the same message.
    assert native_error(local_pg, "has neither REPLICA IDENTITY", log_offset) == message
    time.sleep(1)
    assert "(4,four)" in table_rows(dbs.native, "h") and "(1,changed)" not in table_rows(dbs.native, "h")

    # With a key on the subscriber both go on (the key then finds the rows).
    for dsn in (dbs.ours, dbs.native):
        publish(dsn, "ALTER TABLE h ADD PRIMARY KEY (a)")
    apply(spec, spark=spark)
    native.wait_caught_up()
    assert rows(dbs.ours) == rows(dbs.native)
    assert "(1,changed)" in table_rows(dbs.ours, "h") and "(2,two)" not in table_rows(dbs.ours, "h")


def test_keyless_table_with_replica_identity_full_matches_one_row_per_change(dbs, spark):
    dbs.create("""CREATE TABLE h (a int, v text); CREATE TABLE k (id int PRIMARY KEY, v text);
                  ALTER TABLE h REPLICA IDENTITY FULL;
                  INSERT INTO h VALUES (1, 'a'), (1, 'a'), (1, 'a'), (2, NULL), (2, NULL), (3, 'c'), (10, 'x');
                  CREATE PUBLICATION p FOR TABLE h WHERE (a < 10), k;""", SUBSCRIBER)
    native = dbs.subscribe_native(("p",))
    spec = dbs.spec(("p",), f"ours_{next(names)}")
    run_ours(spec, spark)
    one = "ctid = (SELECT ctid FROM h WHERE {} LIMIT 1)"
    batches = [
        [f"UPDATE h SET v = 'b' WHERE {one.format('a = 1')}",          # one of three identical rows
         f"DELETE FROM h WHERE {one.format('a = 2')}",                 # one of two rows with a NULL
         "UPDATE h SET a = 4 WHERE a = 3",                             # every column but one kept
         "BEGIN; INSERT INTO h VALUES (5, 'new'), (5, 'new'); INSERT INTO k VALUES (1, 'k');"
         f" UPDATE h SET v = 'newer' WHERE {one.format('a = 5')}; COMMIT",   # a row inserted in the same batch
         "UPDATE h SET a = 20 WHERE a = 4",                            # leaves the filter: a DELETE
         "UPDATE h SET a = 6 WHERE a = 10",                            # enters it: an INSERT
         "DELETE FROM h WHERE a = 99"],                                # finds nothing on either side
        ["UPDATE h SET v = 'all' WHERE a = 1", "DELETE FROM h WHERE a = 2", "UPDATE k SET v = 'kk'"],
    ]
    for batch in batches:
        publish(dbs.publisher, *batch)
        apply(spec, spark=spark)
        native.wait_caught_up()
        assert rows(dbs.ours) == rows(dbs.native)
    assert table_rows(dbs.ours, "h") == ["(1,all)", "(1,all)", "(1,all)", "(5,new)", "(5,newer)", "(6,x)"]
