"""The capture publications never change what the publisher's application may do; a lost slot is never crossed.

PostgreSQL refuses an UPDATE or DELETE on a table without a replica identity once any publication
containing it publishes updates or deletes; a table the user publishes for inserts only must stay
updatable after our refresh (issue 14, item 1). A slot dropped outside the tool is a gap that only a
new copy closes (item 5).
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from airflow_provider_rowfilter.change_log.log import ChangeLog
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.drop import drop
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.publisher.capture import capture
from airflow_provider_rowfilter.publisher.capture_objects import capture_publication_names
from airflow_provider_rowfilter.subscriber.state import SlotLostError
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.databases import names

TABLES = """
CREATE TABLE h (a int, v text);                 -- no primary key, no replica identity
CREATE TABLE k (id int PRIMARY KEY, v text);
CREATE TABLE t (id int PRIMARY KEY, v text);
"""
PUBLICATIONS = """
CREATE PUBLICATION ph FOR TABLE h WITH (publish = 'insert');
CREATE PUBLICATION pk FOR TABLE k WITH (publish = 'insert, update');
CREATE PUBLICATION pt FOR TABLE t;
"""


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def members(pub: str, subscription: str) -> dict[str, tuple[str, list[str]]]:
    """Each capture publication of ``subscription``: its publish flags (iudt) and its tables."""
    names = list(capture_publication_names(subscription).values())
    with psycopg.connect(pub) as conn:
        rows = conn.execute(
            """SELECT p.pubname, concat(CASE WHEN pubinsert THEN 'i' END, CASE WHEN pubupdate THEN 'u' END,
                                        CASE WHEN pubdelete THEN 'd' END, CASE WHEN pubtruncate THEN 't' END),
                      coalesce(array_agg(c.relname ORDER BY c.relname) FILTER (WHERE c.oid IS NOT NULL), '{}')
               FROM pg_publication p LEFT JOIN pg_publication_rel r ON r.prpubid = p.oid
               LEFT JOIN pg_class c ON c.oid = r.prrelid
               WHERE p.pubname = ANY(%s) GROUP BY 1, 2""", (names,)).fetchall()
    return {name.removeprefix(f"rowfilter_{subscription}"): (flags, tables) for name, flags, tables in rows}


@pytest.fixture
def setup(dbs):
    # The subscriber's h has no key either: a table that only gets inserts needs none (as natively).
    dbs.create(TABLES + PUBLICATIONS, TABLES)
    return dbs


def test_capture_publications_publish_per_table_only_what_the_subscription_publishes(setup, tmp_path):
    dbs = setup
    name = f"ours_{next(names)}"
    spec = dbs.spec(("ph", "pk", "pt"), name, "spark")  # the capture publications are spark mode's
    execute(dbs.publisher, "INSERT INTO h VALUES (1, 'a')", "UPDATE h SET v = 'b'", "DELETE FROM h")  # before
    refresh(spec)
    assert members(dbs.publisher, name) == {
        "": ("iudt", ["t"]), "_insert": ("i", ["h", "k"]), "_update": ("u", ["k"]), "_delete": ("d", []),
        "_truncate": ("t", [])}
    # The publisher's application is not changed by our objects: h has no replica identity.
    execute(dbs.publisher, "INSERT INTO h VALUES (2, 'a')", "UPDATE h SET v = 'c'", "DELETE FROM h WHERE a = 2",
            "INSERT INTO k VALUES (1, 'a'), (2, 'b')", "UPDATE k SET v = 'z' WHERE id = 1", "DELETE FROM k",
            "INSERT INTO t VALUES (1, 'a')", "DELETE FROM t")
    captured = capture(spec)
    # Only what the publications publish reaches the log: h's insert, k's inserts and update, t's all.
    assert captured.changes_by_kind == {"insert": 4, "update": 1, "delete": 1}

    # A publish list changed with ALTER PUBLICATION moves the table at the next refresh.
    execute(dbs.publisher, "ALTER PUBLICATION pk SET (publish = 'insert, update, delete, truncate')",
            "ALTER PUBLICATION ph SET (publish = 'insert, truncate')")
    assert refresh(spec).capture_publication_changed
    assert members(dbs.publisher, name) == {
        "": ("iudt", ["k", "t"]), "_insert": ("i", ["h"]), "_update": ("u", []), "_delete": ("d", []),
        "_truncate": ("t", ["h"])}
    execute(dbs.publisher, "INSERT INTO k VALUES (3, 'c')", "DELETE FROM k", "UPDATE h SET v = 'd'",
            "TRUNCATE h")
    assert capture(spec).changes_by_kind == {"insert": 1, "delete": 1, "truncate": 1}

    # drop removes every capture publication, and leaves the user's alone.
    assert drop(spec).publication_dropped
    assert members(dbs.publisher, name) == {}
    with psycopg.connect(dbs.publisher) as conn:
        assert [n for (n,) in conn.execute("SELECT pubname FROM pg_publication ORDER BY 1")] == ["ph", "pk", "pt"]


class Workload(threading.Thread):
    """The publisher's application: INSERT and UPDATE (and DELETE) on the keyless table, in a loop."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.rounds = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                i = 1000 + self.rounds
                for statement in (f"INSERT INTO h VALUES ({i}, 'new')", f"UPDATE h SET v = 'upd' WHERE a = {i - 1}",
                                  f"DELETE FROM h WHERE a = {i - 5}"):
                    try:
                        conn.execute(statement)
                    except psycopg.Error as e:
                        self.errors.append(f"{statement}: {e.diag.message_primary}")
                self.rounds += 1
                time.sleep(0.005)


def test_keyless_insert_only_table_stays_writable_with_the_workload_running(setup, spark):
    dbs = setup
    execute(dbs.publisher, "INSERT INTO h SELECT g, 'old' FROM generate_series(1, 50) g")
    native = dbs.subscribe_native(("ph",))
    spec = dbs.spec(("ph",), f"ours_{next(names)}")
    workload = Workload(dbs.publisher)
    workload.start()
    try:
        time.sleep(0.5)
        refresh(spec)
        assert sync_tables(spec, spark=spark).ok
        apply(spec, spark=spark)
        time.sleep(1)
        apply(spec, spark=spark)
    finally:
        workload.stop.set()
        workload.join()
    assert workload.errors == [] and workload.rounds > 20
    apply(spec, spark=spark)
    native.wait_caught_up()
    # Our copy started later than the native one, mid-workload: it holds the rows as updated by then. Past
    # the last row it saw updated, no row had been updated or deleted yet: from there on both subscribers
    # hold every insert, as inserted (the publisher's updates and deletes are not published).
    ours, theirs = rows(dbs.ours), rows(dbs.native)
    boundary = max(a for a, v in ours.items() if v == "upd")
    after = {a: v for a, v in ours.items() if a > boundary}
    assert after == {a: v for a, v in theirs.items() if a > boundary}
    assert len(after) > 10 and set(after.values()) == {"new"}
    assert set(ours) <= set(theirs)


def rows(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT a, v FROM h").fetchall())


def test_a_slot_dropped_outside_the_tool_is_refused_then_recopied_on_request(setup, spark):
    dbs = setup
    spec = dbs.spec(("pk", "pt"), f"ours_{next(names)}")
    execute(dbs.publisher, "INSERT INTO k VALUES (1, 'a')", "INSERT INTO t VALUES (1, 'a')")
    refresh(spec)
    assert sync_tables(spec, spark=spark).ok
    execute(dbs.publisher, "INSERT INTO t VALUES (2, 'b')")
    apply(spec, spark=spark)
    with psycopg.connect(dbs.ours) as conn:
        before = conn.execute("SELECT schema_name, table_name, state, lsn::text FROM rowfilter.subscription_rel "
                              "ORDER BY 1, 2").fetchall()
    assert {state for _, _, state, _ in before} == {"r"}
    log_dir = spec.change_log_dir()
    log_before = sorted((p.name, p.read_bytes()) for p in log_dir.iterdir() if p.is_file())

    slot = f"rowfilter_{spec.subscription}"
    execute(dbs.publisher, f"SELECT pg_drop_replication_slot('{slot}')")
    execute(dbs.publisher, "INSERT INTO t VALUES (3, 'lost')", "UPDATE k SET v = 'lost' WHERE id = 1")

    # The apply stops the same way, with the fix that works (plain refresh refuses), and records it.
    with pytest.raises(SlotLostError, match=rf"subscription '{spec.subscription}' is broken: replication slot") as caught:
        apply(spec, spark=spark)
    assert "rowfilter refresh --recreate-slot" in caught.value.hint
    with psycopg.connect(dbs.ours) as conn:
        recorded = conn.execute("SELECT last_error FROM rowfilter.subscription WHERE name = %s",
                                (spec.subscription,)).fetchone()[0]
    assert "is broken" in recorded and "rowfilter refresh --recreate-slot" in recorded

    with pytest.raises(SlotLostError, match=rf'replication slot "{slot}" no longer exists on the publisher; '
                       r"changes after LSN \S+ were never captured") as caught:
        refresh(spec)
    assert "--recreate-slot" in caught.value.hint
    with psycopg.connect(dbs.ours) as conn:
        assert conn.execute("SELECT schema_name, table_name, state, lsn::text FROM rowfilter.subscription_rel "
                            "ORDER BY 1, 2").fetchall() == before
    with psycopg.connect(dbs.publisher) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0] == 0
    assert sorted((p.name, p.read_bytes()) for p in log_dir.iterdir() if p.is_file()) == log_before

    result = refresh(spec, recreate_slot=True)
    assert result.slot_created and result.resynced == ["public.k", "public.t"]
    with psycopg.connect(dbs.ours) as conn:
        assert {s for (s,) in conn.execute("SELECT state FROM rowfilter.subscription_rel")} == {"i"}
    assert table_rows(dbs.ours, "k") == table_rows(dbs.ours, "t") == []
    (replaced,) = log_dir.parent.glob(f"{log_dir.name}.replaced-*")  # the old slot's log, set aside
    assert sorted((p.name, p.read_bytes()) for p in replaced.iterdir() if p.is_file()) == log_before
    assert sync_tables(spec, spark=spark).ok
    execute(dbs.publisher, "INSERT INTO t VALUES (4, 'after')")
    apply(spec, spark=spark)
    for table in ("k", "t"):
        assert table_rows(dbs.ours, table) == table_rows(dbs.publisher, table), table
    # The apply recorded the new log: the one set aside, of a slot that no longer exists, is removed.
    assert not replaced.exists() and ChangeLog(log_dir).segments()
