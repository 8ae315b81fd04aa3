"""A change whose relation no longer matches the definitions stops the batch untouched (issue 14, items 2 and 3).

The apply judges changes by table and column *names*; the capture publication lists tables by OID,
so a table renamed on the publisher keeps sending changes under its new name, and a renamed column
under its new one. Each case renames on a real publisher, checks that ApplyChanges stops with
PostgreSQL's wording (naming the relation and the LSN) leaving the subscriber's tables, the positions
and ``batch_history`` as they were, then follows the documented recovery and checks that the
subscriber ends equal to the publisher's rows under the filters (the changes of the renamed period
included). Native replication stops too here, so the referee is the publisher's filtered rows.
"""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.change_log.log import ChangeLog
from airflow_provider_rowfilter.change_log.segment_reader import segment_relations
from airflow_provider_rowfilter.core.apply.relation_checks import RelationChangedError
from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import resync, sync_tables
from airflow_provider_rowfilter.subscriber.apply_target import ApplyTargetError
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.apply_scenario import (
    SUBSCRIBER,
    expected,
    frozen,
    positions,
    publish,
    publisher_sql,
    subscription,
    table_error,
    wal_lsn,
    write_spec,
)
from tests.e2e.jobs.databases import run_ours

PUBLISHER = publisher_sql(60, 90)
def test_table_renamed_on_the_publisher_stops_until_renamed_back_and_resynced(dbs, spark, tmp_path):
    dbs.create(PUBLISHER, SUBSCRIBER)
    _, spec = write_spec(dbs, tmp_path)
    run_ours(spec, spark)
    apply(spec, max_changes=1000, spark=spark)  # t and u in r
    start = wal_lsn(dbs.publisher)
    publish(dbs.publisher, ["ALTER TABLE t RENAME TO t3r",
                            "INSERT INTO t3r VALUES (501, 1, 'under the new name')",
                            "UPDATE t3r SET v = 'updated as t3r' WHERE id = 2",
                            "DELETE FROM t3r WHERE id = 3",
                            "UPDATE u SET n = 99 WHERE k = 10"])  # a table nobody renamed: not applied either
    before = frozen(dbs, spec)

    with pytest.raises(RelationChangedError) as caught:
        apply(spec, max_changes=1000, spark=spark)
    error = caught.value
    text = str(error)
    assert error.message == 'logical replication target relation "public.t3r" does not exist', text
    assert error.lsn > start and f"finished at {format_lsn(error.lsn)}" in text, text
    assert "rowfilter resync --table" in text and "rowfilter refresh" in text, text
    assert frozen(dbs, spec) == before  # nothing applied, no position moved, no batch recorded
    assert text in subscription(dbs, spec)["last_error"]
    # The capture before the apply made the changes durable in the log and moved the slot that far only.
    log = ChangeLog(spec.change_log_dir())
    assert {s.table for seg in log.segments() for s in segment_relations(seg.path)} >= {"t3r", "u"}

    # Renamed back: the changes made as t3r are still in the log, due for t: still stopped, untouched.
    publish(dbs.publisher, ["ALTER TABLE t3r RENAME TO t", "INSERT INTO t VALUES (502, 2, 'renamed back')"])
    with pytest.raises(RelationChangedError) as caught:
        apply(spec, max_changes=1000, spark=spark)
    text = str(caught.value)
    assert caught.value.lsn == error.lsn and "rowfilter resync --table public.t --copy" in text, text
    assert frozen(dbs, spec) == before
    assert text in table_error(dbs, spec, "public.t")  # its OID now says which subscribed table it is
    # The documented recovery: copy t again; its position moves past the t3r changes, the rest applies.
    resync(spec, [TableName("public", "t")], copy=True, spark=spark)
    publish(dbs.publisher, ["INSERT INTO t VALUES (503, 3, 'after the resync')"])
    result = apply(spec, max_changes=1000, spark=spark)
    assert result.batch_id is not None
    assert table_rows(dbs.ours, "t") == expected(dbs, "t")
    assert table_rows(dbs.ours, "u") == expected(dbs, "u")
    assert {'(501,1,"under the new name")', '(2,2,"updated as t3r")'} <= set(table_rows(dbs.ours, "t"))
    assert not any(r.startswith("(3,") for r in table_rows(dbs.ours, "t"))
    assert "(10,b,99)" in table_rows(dbs.ours, "u")
    assert subscription(dbs, spec)["last_error"] is None
    assert all(state == "r" for _, _, state, _ in positions(dbs, spec))


def test_table_renamed_then_followed_by_refresh_and_table_removed_by_refresh_is_dropped(dbs, spark, tmp_path):
    dbs.create(PUBLISHER, SUBSCRIBER)
    _, spec = write_spec(dbs, tmp_path)
    run_ours(spec, spark)
    publish(dbs.publisher, ["ALTER TABLE t RENAME TO t3r", "INSERT INTO t3r VALUES (501, 1, 'new name')",
                            "UPDATE u SET n = 98 WHERE k = 10"])
    with pytest.raises(RelationChangedError, match='relation "public.t3r" does not exist'):
        apply(spec, max_changes=1000, spark=spark)
    # Follow the new name: the subscriber gets the table, refresh sees the publication list it by its
    # new name (t leaves the subscription, t3r enters in i), the copy brings its rows.
    publish(dbs.ours, ["CREATE TABLE t3r (id int PRIMARY KEY, grp int, v text)"])
    changed = refresh(spec)
    assert changed.added == ["public.t3r"] and changed.removed == ["public.t"], changed
    sync_tables(spec, spark=spark)
    # u leaves the subscription by a refresh: its changes still in the log are names the definitions
    # knew, simply not applied (as PostgreSQL stops replicating a table REFRESH PUBLICATION removed).
    publish(dbs.publisher, ["UPDATE u SET n = 97 WHERE k = 10", "INSERT INTO t3r VALUES (502, 2, 'later')"])
    followed = apply(spec, max_changes=1000, spark=spark)
    assert followed.batch_id is not None
    u_before = table_rows(dbs.ours, "u")
    assert "(10,b,97)" in u_before
    publish(dbs.publisher, ["UPDATE u SET n = 96 WHERE k = 10", "ALTER PUBLICATION pf_u DROP TABLE u"])
    assert refresh(spec).removed == ["public.u"]
    result = apply(spec, max_changes=1000, spark=spark)
    assert result.batch_id is not None
    assert table_rows(dbs.ours, "t3r") == expected(dbs, "t", "t3r")
    assert '(502,2,later)' in table_rows(dbs.ours, "t3r")
    assert table_rows(dbs.ours, "u") == u_before  # (10,b,96) was logged as u, and dropped


def test_filter_column_renamed_on_the_publisher_stops_until_renamed_back_and_resynced(dbs, spark, tmp_path):
    # Spark judging reads the filter's columns by name (filtering: source has pgoutput read them by number,
    # and the renamed column is then a missing replicated column, as the next test shows).
    dbs.create(PUBLISHER, SUBSCRIBER)
    _, spec = write_spec(dbs, tmp_path, filtering="spark")
    run_ours(spec, spark)
    apply(spec, max_changes=1000, spark=spark)
    start = wal_lsn(dbs.publisher)
    # u's filter reads n; renamed, the publisher's own filter follows it (stored by attribute number).
    publish(dbs.publisher, ["ALTER TABLE u RENAME COLUMN n TO n2",
                            "INSERT INTO u VALUES (700, 'a', 99)",           # passes the filter
                            "UPDATE u SET n2 = 97 WHERE k = 10"])            # enters it (10 was 10)
    end = wal_lsn(dbs.publisher)
    before = frozen(dbs, spec)
    with pytest.raises(RelationChangedError) as caught:
        apply(spec, max_changes=1000, spark=spark)
    error = caught.value
    text = str(error)
    assert error.message == ('logical replication source relation "public.u" is missing column "n" read by the '
                             "subscription's row filter"), text
    assert error.table == "public.u" and start <= error.lsn <= end, (hex(start), hex(error.lsn), hex(end))
    assert "(k, s, n2)" in text and "rowfilter resync --table public.u --copy" in text, text
    assert frozen(dbs, spec) == before
    assert text in subscription(dbs, spec)["last_error"] and text in table_error(dbs, spec, "public.u")

    publish(dbs.publisher, ["ALTER TABLE u RENAME COLUMN n2 TO n", "INSERT INTO u VALUES (701, 'b', 98)"])
    with pytest.raises(RelationChangedError):  # the n2 changes are still due for u
        apply(spec, max_changes=1000, spark=spark)
    assert frozen(dbs, spec) == before
    resync(spec, [TableName("public", "u")], copy=True, spark=spark)
    publish(dbs.publisher, ["UPDATE u SET n = 96 WHERE k = 700"])
    apply(spec, max_changes=1000, spark=spark)
    assert table_rows(dbs.ours, "u") == expected(dbs, "u")
    assert {"(700,a,96)", "(10,b,97)", "(701,b,98)"} <= set(table_rows(dbs.ours, "u"))
    assert table_rows(dbs.ours, "t") == expected(dbs, "t")


def test_unfiltered_column_renamed_on_the_publisher_is_a_missing_replicated_column(dbs, spark, tmp_path):
    # t's filter reads only id: a renamed v arrives as v2, which the subscriber's t lacks (as native).
    dbs.create(PUBLISHER, SUBSCRIBER)
    _, spec = write_spec(dbs, tmp_path)
    run_ours(spec, spark)
    publish(dbs.publisher, ["ALTER TABLE t RENAME COLUMN v TO v2", "INSERT INTO t VALUES (801, 1, 'passes')"])
    before = frozen(dbs, spec)
    with pytest.raises(ApplyTargetError) as caught:
        apply(spec, max_changes=1000, spark=spark)
    assert caught.value.message == 'logical replication target relation "public.t" is missing replicated column: "v2"'
    assert frozen(dbs, spec) == before
    publish(dbs.ours, ["ALTER TABLE t RENAME COLUMN v TO v2"])
    apply(spec, max_changes=1000, spark=spark)
    assert table_rows(dbs.ours, "t") == expected(dbs, "t")


def test_segment_relations_without_metadata_are_read_from_the_columns(dbs, spark, tmp_path):
    """A segment written before the metadata recorded its relations: the apply reads the few columns instead."""
    import pyarrow.parquet as pq

    dbs.create(PUBLISHER, SUBSCRIBER)
    _, spec = write_spec(dbs, tmp_path)
    run_ours(spec, spark)
    publish(dbs.publisher, ["UPDATE t SET v = 'x' WHERE id = 1", "ALTER TABLE t RENAME COLUMN v TO v2",
                            "UPDATE t SET v2 = 'y' WHERE id = 2"])
    from airflow_provider_rowfilter.publisher.capture import capture

    capture(spec)
    (segment,) = ChangeLog(spec.change_log_dir()).segments()
    recorded = segment_relations(segment.path)
    assert [(s.table, s.column_names) for s in recorded] == [("t", ("id", "grp", "v")), ("t", ("id", "grp", "v2"))]
    old = pq.read_table(segment.path)
    pq.write_table(old.replace_schema_metadata({}), segment.path)  # as an older version wrote it
    assert segment_relations(segment.path) == recorded
