"""filtering: spark with the definitions in the publisher's catalog: a publication changed on the publisher never
makes the subscriber diverge silently (issue 17 item 6).

PostgreSQL judges each change by the publications as of its position; the Spark path judges by the definitions
the last refresh recorded. Each kind of ALTER PUBLICATION (filter, publish list, table dropped, column list, a
partition attached) made between two sets of changes stops the next batch untouched, naming what changed; the
changes before it were applied as native applied them; after `rowfilter refresh` the run goes on, and a resync of
the changed table makes it equal to native again. What the change stream carries itself (a replica identity
switched, a column added) is followed where it happens, beside native, without a stop.
"""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

from airflow_provider_rowfilter.core.apply.relation_checks import RelationChangedError
from airflow_provider_rowfilter.core.publication.state import PublicationChangedError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import resync
from airflow_provider_rowfilter.jobs.exit_status import EXIT_ERROR, fail
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.apply_scenario import publish
from tests.e2e.jobs.databases import names, run_ours
from tests.e2e.jobs.publication_changes import ALTERS, PUBLICATIONS, PUBLISHER, TABLES

#: What the stop names for each ALTER of tests/e2e/jobs/test_apply_source_filtering.py (all made at once, one setup).
NAMED = {"set-table-where": "table public.t in publication pt: row filter changed from WHERE (v > 10) to WHERE (v > 100)",
         "set-publish": "publication pu: publish changed from (insert, update, delete, truncate) to (insert)",
         "drop-table": "table public.d: dropped from publication pu",
         "column-list": "table public.c in publication pc: column list changed from (id, a, b) to (id, a)"}
AFTER_REFRESH = ["INSERT INTO t VALUES (301, 50, 'out'), (302, 150, 'in')", "UPDATE t SET v = 7 WHERE id = 202",
                 "UPDATE u SET v = -9 WHERE id = 5", "INSERT INTO u VALUES (14, 14)", "INSERT INTO d VALUES (14, 14)",
                 "INSERT INTO c VALUES (13, 'a13', 'b13 not sent')", "UPDATE c SET b = 'b not sent' WHERE id = 4"]


def _state(dsn: str, spec) -> tuple:
    with psycopg.connect(dsn) as conn:
        rels = conn.execute("SELECT schema_name, table_name, state, lsn::text FROM rowfilter.subscription_rel "
                            "WHERE subscription = %s ORDER BY 1, 2", (spec.subscription,)).fetchall()
        batches = conn.execute("SELECT count(*) FROM rowfilter.batch_history WHERE subscription = %s",
                               (spec.subscription,)).fetchone()
    return rels, batches, tuple(tuple(table_rows(dsn, t)) for t in ("t", "u", "d", "c"))


def test_a_publication_changed_on_the_publisher_stops_the_spark_path_untouched_until_refresh(dbs, spark):
    dbs.create(PUBLISHER, TABLES)
    native = dbs.subscribe_native(PUBLICATIONS)
    spec = dbs.spec(PUBLICATIONS, f"drift_{next(names)}", "spark")
    run_ours(spec, spark)
    publish(dbs.publisher, [s for before, _, _ in ALTERS.values() for s in before])
    apply(spec, spark=spark)  # judged by the definitions of the refresh: the same as native's
    native.wait_caught_up()
    dbs.assert_same(("t", "u", "d", "c"))

    publish(dbs.publisher, [change for _, change, _ in ALTERS.values()])
    publish(dbs.publisher, [s for _, _, after in ALTERS.values() for s in after])
    untouched = _state(dbs.ours, spec)
    with pytest.raises(PublicationChangedError) as raised:
        apply(spec, spark=spark)
    text = str(raised.value)
    assert all(said in text for said in NAMED.values()), text
    assert "rowfilter refresh" in text and "Nothing of the batch" in text, text
    assert fail(raised.value) == EXIT_ERROR  # a person must act: the operators do not retry it
    assert _state(dbs.ours, spec) == untouched  # nothing of the batch was applied, no position moved
    with pytest.raises(PublicationChangedError):
        apply(spec, spark=spark, capture_first=False)  # and again, until someone acts

    result = refresh(spec)
    assert result.definitions_changed and result.removed == ["public.d"], result
    apply(spec, spark=spark)  # the run goes on: the changes in between judged by the old definitions
    assert _rows(dbs.ours, "SELECT id, v FROM t WHERE id IN (201, 202)") == [(201, 50), (202, 150)]  # old: v > 10
    assert _rows(dbs.ours, "SELECT id, v FROM u WHERE id IN (3, 4)") == [(3, -1)]  # old: UPDATE, DELETE published
    assert _rows(dbs.ours, "SELECT id, b FROM c WHERE id = 12") == [(12, "b12 not sent")]  # old list: b sent
    assert _rows(dbs.ours, "SELECT id FROM d WHERE id IN (12, 14)") == []  # d left the subscription

    publish(dbs.publisher, AFTER_REFRESH)  # changes after the refresh: the new definitions, as natively
    apply(spec, spark=spark)
    native.wait_caught_up()
    for query in ("SELECT id, v FROM t WHERE id > 300 OR id = 202", "SELECT id, v FROM u WHERE id IN (5, 14)",
                  "SELECT id, a, b FROM c WHERE id IN (4, 13)", "SELECT id FROM d WHERE id = 14"):
        assert _rows(dbs.ours, query) == _rows(dbs.native, query), query
    # A table whose in-between changes matter is copied anew under the new definition (as a new subscription
    # would have it): rows outside the new filter are gone, the later changes apply on top.
    resync(spec, [TableName("public", "t")], copy=True, spark=spark)
    with psycopg.connect(dbs.publisher) as conn:
        assert table_rows(dbs.ours, "t") == sorted(r for r, in conn.execute("SELECT x::text FROM t x WHERE v > 100"))


def _rows(dsn: str, query: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query + " ORDER BY 1").fetchall()


PARTITIONED = """
CREATE TABLE m(id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (100);
"""


def test_a_partition_attached_to_a_subscribed_root_stops_the_spark_path(dbs, spark):
    dbs.create(PARTITIONED + "INSERT INTO m VALUES (1, 1); CREATE PUBLICATION pm FOR TABLE m "
               "WITH (publish_via_partition_root = true);", PARTITIONED)
    spec = dbs.spec(("pm",), f"drift_{next(names)}", "spark")
    run_ours(spec, spark)
    publish(dbs.publisher, ["CREATE TABLE m2 PARTITION OF m FOR VALUES FROM (100) TO (200)",
                            "INSERT INTO m VALUES (2, 2), (101, 101)"])
    with pytest.raises(PublicationChangedError, match=r"table public\.m: partitions changed from \(public\.m1\) "
                       r"to \(public\.m1, public\.m2\)"):
        apply(spec, spark=spark)  # natively the new partition's rows replicate through the root at once
    refresh(spec)
    apply(spec, spark=spark)
    assert table_rows(dbs.ours, "m")[:1] == ["(1,1)"]


FOLLOWED = """
CREATE TABLE f(id int PRIMARY KEY, k int NOT NULL UNIQUE, v int);
INSERT INTO f SELECT g, g, g FROM generate_series(1, 20) g;
CREATE UNIQUE INDEX f_kid ON f (k, id);
CREATE TABLE l(id int PRIMARY KEY, a text, b text);
INSERT INTO l VALUES (1, 'a', 'b');
CREATE PUBLICATION pf FOR TABLE f WHERE (id > 5), l (id, a);
"""


def test_a_replica_identity_switch_and_an_added_column_are_followed_where_they_happen(dbs, spark):
    """Carried by the stream itself (the old tuple as logged, the Relation message's columns; a column added to
    a listed table stays outside the list): no stop, the same rows as native."""
    dbs.create(FOLLOWED, "CREATE TABLE f(id int PRIMARY KEY, k int NOT NULL UNIQUE, v int, note text);"
               "CREATE TABLE l(id int PRIMARY KEY, a text, b text, z text);")
    native = dbs.subscribe_native(("pf",))
    spec = dbs.spec(("pf",), f"drift_{next(names)}", "spark")
    run_ours(spec, spark)
    publish(dbs.publisher, [
        "UPDATE f SET v = -1 WHERE id = 3", "UPDATE f SET id = 30 WHERE id = 4",
        "ALTER TABLE f REPLICA IDENTITY FULL",
        "UPDATE f SET id = 0 WHERE id = 6", "UPDATE f SET v = -2 WHERE id = 7", "DELETE FROM f WHERE id IN (1, 8)",
        "ALTER TABLE f ADD COLUMN note text", "ALTER TABLE l ADD COLUMN z text",  # l's list leaves z out
        "INSERT INTO l VALUES (2, 'a2', 'b2', 'z2')", "UPDATE l SET z = 'z1', a = 'a1' WHERE id = 1",
        "INSERT INTO f VALUES (40, 40, 40, 'new column')", "UPDATE f SET note = 'set' WHERE id IN (0, 9, 30)",
        "ALTER TABLE f REPLICA IDENTITY USING INDEX f_kid",
        "UPDATE f SET id = 50 WHERE id = 10", "UPDATE f SET id = 1 WHERE id = 12", "DELETE FROM f WHERE id = 11"])
    result = apply(spec, spark=spark)
    assert result.drained and result.changes, result.summary()
    native.wait_caught_up()
    dbs.assert_same(("f", "l"))


FILED = """
CREATE TABLE g(id int PRIMARY KEY, v int, w text);
ALTER TABLE g REPLICA IDENTITY FULL;
INSERT INTO g SELECT i, i, 'w' FROM generate_series(1, 30) i;
"""


def test_a_replica_identity_switched_under_a_publications_file_stops_at_the_update_postgresql_refuses(
        dbs, spark, tmp_path):
    """A file's filter on a non-key column is valid under REPLICA IDENTITY FULL; switched to DEFAULT on the
    publisher, which knows nothing of the file, its UPDATEs are logged without the old row the filter reads.
    PostgreSQL refuses such an UPDATE; the apply stops at it (INSERTs still replicate), untouched."""
    ddl = tmp_path / "publications.sql"
    ddl.write_text("CREATE PUBLICATION pg FOR TABLE g WHERE (v > 10);\n")
    dbs.create(FILED, "CREATE TABLE g(id int PRIMARY KEY, v int, w text);")
    spec = dataclasses.replace(dbs.spec(("pg",), f"drift_{next(names)}"), publications_ddl=str(ddl))
    run_ours(spec, spark)
    publish(dbs.publisher, ["UPDATE g SET v = 50 WHERE id = 1", "ALTER TABLE g REPLICA IDENTITY DEFAULT",
                            "INSERT INTO g VALUES (40, 40, 'in'), (41, 4, 'out')"])
    apply(spec, spark=spark)  # the old full row before the switch, INSERTs after it: judged as PostgreSQL does
    assert _rows(dbs.ours, "SELECT id, v FROM g WHERE id IN (1, 40, 41)") == [(1, 50), (40, 40)]

    publish(dbs.publisher, ["UPDATE g SET v = 5 WHERE id = 20", "DELETE FROM g WHERE id = 21"])
    untouched = table_rows(dbs.ours, "g")
    with pytest.raises(RelationChangedError, match='cannot update table "g"') as raised:
        apply(spec, spark=spark)
    assert "Column used in the publication WHERE expression is not part of the replica identity" \
        in str(raised.value) and "REPLICA IDENTITY DEFAULT (key: id)" in str(raised.value), str(raised.value)
    assert table_rows(dbs.ours, "g") == untouched  # judged on the new row alone, id 20 would have stayed

    publish(dbs.publisher, ["ALTER TABLE g REPLICA IDENTITY FULL"])
    resync(spec, [TableName("public", "g")], copy=True, spark=spark)  # the fix the error names
    publish(dbs.publisher, ["UPDATE g SET v = 6 WHERE id = 22"])
    apply(spec, spark=spark)
    with psycopg.connect(dbs.publisher) as conn:
        assert table_rows(dbs.ours, "g") == sorted(r for r, in conn.execute("SELECT x::text FROM g x WHERE v > 10"))
