"""filtering: source — the publisher's pgoutput evaluates the publications, beside native logical replication.

A publication changed on the publisher takes effect where PostgreSQL's does (issue 17 item 6): every
case changes the publication between two sets of changes made just before and just after the ALTER,
all captured and applied in ONE batch (no refresh in between), and the subscriber must equal a native
subscription's. Then what the publisher evaluates and Spark could not (a regex back reference), a filter
outside the replica identity (accepted, the publisher refusing its own UPDATE), and the one-mode batch.
"""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

from airflow_provider_rowfilter.change_log.log import ChangeLog
from airflow_provider_rowfilter.change_log.segment_reader import segment_filtering
from airflow_provider_rowfilter.core.errors import RowFilterError, UntranslatableFilterError
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.publisher.capture import capture
from airflow_provider_rowfilter.publisher.capture_objects import capture_publications
from airflow_provider_rowfilter.publisher.definitions import load_definitions
from tests.e2e.jobs.apply_scenario import publish
from tests.e2e.jobs.databases import names, run_ours
from tests.e2e.jobs.publication_changes import ALTERS, PUBLICATIONS, PUBLISHER, TABLES


@pytest.mark.parametrize("alter", ALTERS.values(), ids=ALTERS.keys())
def test_a_publication_changed_mid_batch_takes_effect_where_native_does(dbs, spark, alter):
    before, change, after = alter
    dbs.create(PUBLISHER, TABLES)
    native = dbs.subscribe_native(PUBLICATIONS)
    spec = dbs.spec(PUBLICATIONS, f"src_{next(names)}")  # auto: source on this PostgreSQL 18
    run_ours(spec, spark)
    publish(dbs.publisher, [*before, change, *after])
    result = apply(spec, spark=spark)
    assert result.capture["filtering"] == "source" and result.segments == 1, result.summary()
    native.wait_caught_up()
    dbs.assert_same(("t", "u", "d", "c"))


SUBSTR_TABLES = "CREATE TABLE s(id int PRIMARY KEY, code text, note text);"
SUBSTR_PUBLISHER = SUBSTR_TABLES + """
ALTER TABLE s REPLICA IDENTITY FULL;
INSERT INTO s SELECT g, 'AB' || g || 'XY' || (g % 3), 'n' FROM generate_series(1, 40) g;
CREATE PUBLICATION ps FOR TABLE s WHERE (substr(code, 3, 1) <> '1' AND code ~ '([02])\\1?$');
"""


def test_a_filter_spark_cannot_evaluate_replicates_when_the_publisher_evaluates_it(dbs, spark):
    dbs.create(SUBSTR_PUBLISHER, SUBSTR_TABLES)
    native = dbs.subscribe_native(("ps",))
    spec = dbs.spec(("ps",), f"src_{next(names)}")
    with pytest.raises(UntranslatableFilterError):  # judged in Spark it is refused up front, changing nothing
        refresh(dataclasses.replace(spec, filtering="spark"))
    run_ours(spec, spark)
    publish(dbs.publisher, ["INSERT INTO s VALUES (100, 'AB1XY0', 'out'), (101, 'AB2XY2', 'in')",
                            "UPDATE s SET code = 'AB5XY2' WHERE id = 1", "UPDATE s SET code = code || '0' WHERE id = 6",
                            "DELETE FROM s WHERE id IN (2, 3, 4)", "UPDATE s SET note = 'kept?' WHERE id < 30"])
    apply(spec, spark=spark)
    native.wait_caught_up()
    dbs.assert_same(("s",))


IDENTITY_TABLES = "CREATE TABLE r(id int PRIMARY KEY, region text, v int);"
IDENTITY_PUBLISHER = IDENTITY_TABLES + """
INSERT INTO r SELECT g, CASE WHEN g % 2 = 0 THEN 'east' ELSE 'west' END, g FROM generate_series(1, 10) g;
CREATE PUBLICATION pr FOR TABLE r WHERE (region = 'east');
"""


def test_a_filter_outside_the_replica_identity_replicates_inserts_and_the_publisher_refuses_its_update(dbs, spark):
    dbs.create(IDENTITY_PUBLISHER, IDENTITY_TABLES)
    native = dbs.subscribe_native(("pr",))
    spec = dbs.spec(("pr",), f"src_{next(names)}")
    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        warnings = load_definitions(spec, conn).warnings
    assert len(warnings) == 1 and "Column used in the publication WHERE expression is not part of the replica " \
        "identity" in warnings[0] and 'cannot update table "r"' in warnings[0]
    assert run_ours(spec, spark).ok
    publish(dbs.publisher, ["INSERT INTO r VALUES (20, 'east', 20), (21, 'west', 21)"])
    with pytest.raises(psycopg.errors.InvalidColumnReference, match='cannot update table "r"'):
        publish(dbs.publisher, ["UPDATE r SET v = 0 WHERE id = 2"])  # PostgreSQL's refusal, on the publisher
    apply(spec, spark=spark)
    native.wait_caught_up()
    dbs.assert_same(("r",))
    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        assert capture_publications(conn, spec.subscription) == []  # nothing of ours can refuse the publisher's DML


def test_a_batch_never_mixes_modes_it_ends_where_the_capture_mode_changed(dbs, spark):
    dbs.create(PUBLISHER, TABLES)
    native = dbs.subscribe_native(PUBLICATIONS)
    source = dbs.spec(PUBLICATIONS, f"src_{next(names)}", "source")
    judged = dataclasses.replace(source, filtering="spark")
    run_ours(judged, spark)  # the spark mode's refresh: capture publications, definitions recorded
    publish(dbs.publisher, ["INSERT INTO t VALUES (101, 5, 'out'), (102, 50, 'in')", "UPDATE u SET v = 0 WHERE id = 1"])
    first = capture(judged)
    publish(dbs.publisher, ["INSERT INTO t VALUES (201, 6, 'out'), (202, 60, 'in')", "DELETE FROM u WHERE id = 2"])
    second = capture(source)
    log = ChangeLog(source.change_log_dir())
    assert [segment_filtering(s.path) for s in log.segments()][-2:] == ["spark", "source"]
    run = apply(source, spark=spark, capture_first=False)  # one run, two batches: one per mode
    assert run.batches == 2 and run.drained and run.end_lsn == second.end_lsn, run.summary()
    with psycopg.connect(dbs.ours) as conn:
        ends = conn.execute("SELECT end_lsn::text FROM rowfilter.batch_history WHERE id = ANY(%s) ORDER BY id",
                            (run.batch_ids,)).fetchall()
    assert [e for e, in ends] == [first.end_lsn, second.end_lsn] and first.end_lsn != second.end_lsn
    native.wait_caught_up()
    dbs.assert_same(("t", "u", "d", "c"))


def test_a_table_published_since_the_last_refresh_waits_for_it_and_a_renamed_one_stops_the_batch(dbs, spark):
    """Read through the subscription's publications, the slot also sends a table added to one of them:
    as the apply worker, its changes wait for REFRESH PUBLICATION (the others apply); a subscribed table
    renamed on the publisher still stops the batch, naming it."""
    dbs.create(PUBLISHER + "CREATE TABLE n(id int PRIMARY KEY, v int);", TABLES + "CREATE TABLE n(id int PRIMARY KEY, v int);")
    native = dbs.subscribe_native(PUBLICATIONS)
    spec = dbs.spec(PUBLICATIONS, f"src_{next(names)}")
    run_ours(spec, spark)
    publish(dbs.publisher, ["ALTER PUBLICATION pu ADD TABLE n", "INSERT INTO n VALUES (1, 1), (2, 2)",
                            "INSERT INTO u VALUES (31, 31)"])
    result = apply(spec, spark=spark)
    assert result.tables["public.u"]["insert"] == 1 and "public.n" not in result.tables, result.summary()
    native.wait_caught_up()
    dbs.assert_same(("t", "u", "d", "c"))
    with psycopg.connect(dbs.ours) as conn:
        assert conn.execute("SELECT count(*) FROM n").fetchone() == (0,)  # not subscribed yet, as natively
    assert refresh(spec).added == ["public.n"]
    run_ours(spec, spark)
    apply(spec, spark=spark)
    with psycopg.connect(dbs.ours) as conn:
        assert conn.execute("SELECT id, v FROM n ORDER BY id").fetchall() == [(1, 1), (2, 2)]

    publish(dbs.publisher, ["ALTER TABLE u RENAME TO u_renamed", "INSERT INTO u_renamed VALUES (32, 32)"])
    with pytest.raises(RowFilterError, match='logical replication target relation "public.u_renamed" does not exist'):
        apply(spec, spark=spark)
