"""PostgreSQL 15 as the publisher: its initial copy of a partition published both directly and through its root,
and numeric's NaN and infinities in row filters and as data.

A partition published on its own by one publication and through its root (``publish_via_partition_root``) by
another is copied twice by a PostgreSQL 15 subscription: 15's ``pg_get_publication_tables`` lists both the root
and the partition, and tablesync copies each. PostgreSQL 16 lists the root only (pg_publication.c
``filter_partitions`` applied across all the subscription's publications), so the rows are copied once. Ours
copies once against every version (core/publication/subscription_filters.py drops a partition whose published
ancestor is in the list), as 16 does: this test holds the native 15 subscription and ours to that, on a
PostgreSQL 15 cluster (Debian's ``/usr/lib/postgresql/15/bin``, or ``$ROWFILTER_PG15_BIN_DIR``; skipped where
there is none), started for this module only (about 2 s). The numeric case (tests/e2e/jobs/differential_cases.py
``numeric-nan-and-infinities``) runs in both capture modes beside a native 15 subscription.
"""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.apply_scenario import publish
from tests.e2e.jobs.databases import Databases, apply_path, names, run_ours
from tests.e2e.jobs.differential_cases import CASES
from tests.pg_versions import pg15_bin_dir

TABLES = """
CREATE TABLE parent(a int, b text) PARTITION BY RANGE (a);
CREATE TABLE child_low PARTITION OF parent FOR VALUES FROM (MINVALUE) TO (100);
CREATE TABLE child_high PARTITION OF parent FOR VALUES FROM (100) TO (MAXVALUE);
"""
# No key on the subscriber: the doubled rows land (with one, 15's second copy fails and its tablesync retries).
PUBLISHER = TABLES + """
INSERT INTO parent SELECT g, 'row ' || g FROM generate_series(5, 195, 10) g;
CREATE PUBLICATION proot FOR TABLE parent WITH (publish_via_partition_root = true);
CREATE PUBLICATION pleaf FOR TABLE child_low;
"""


@pytest.fixture(scope="module")
def local_pg15():
    with LocalPostgres.start(bin_dir=pg15_bin_dir()) as pg:
        assert pg.version_num // 10000 == 15
        yield pg


@pytest.fixture
def dbs15(local_pg15, tmp_path):
    made = [f"t15_{role}_{next(names)}" for role in ("pub", "native", "ours")]
    databases = Databases(*(local_pg15.create_database(name) for name in made), change_logs=tmp_path)
    yield databases
    for native in databases.natives:
        native.drop()
    for name in reversed(made):
        local_pg15.drop_database(name)


def test_a_partition_published_both_ways_is_copied_twice_by_15_and_once_by_ours(dbs15, spark):
    dbs15.create(PUBLISHER, TABLES)
    publications = ("proot", "pleaf")
    native = dbs15.subscribe_native(publications)
    native.wait_synced()
    run_ours(dbs15.spec(publications, f"ours15_{next(names)}"), spark)

    published = table_rows(dbs15.publisher, "parent")
    low = [r for r in published if int(r.strip("()").split(",")[0]) < 100]
    assert low and len(low) < len(published)
    assert table_rows(dbs15.ours, "parent") == published  # once, as PostgreSQL 16 and later copy it
    assert table_rows(dbs15.native, "parent") == sorted(published + low)  # 15: child_low's rows twice


@pytest.mark.parametrize("path", ["source", "spark"])
def test_numeric_nan_and_infinities_on_a_postgresql15_publisher_match_native(dbs15, spark, monkeypatch, path):
    """numeric's NaN (above every number, equal to itself) and ±Infinity (PostgreSQL 14 on) in the filters and as
    data, judged by 15's pgoutput (source) or by Spark (spark), copied then streamed: every table as native 15's."""
    with psycopg.connect(dbs15.publisher, autocommit=True) as conn:
        assert conn.info.server_version // 10000 == 15
    publisher, subscriber, publications, tables, batches = CASES["numeric-nan-and-infinities"]
    filtering, engines = apply_path(monkeypatch, path)
    dbs15.create(publisher, subscriber)
    native = dbs15.subscribe_native(publications)
    spec = dbs15.spec(publications, f"ours15_{next(names)}", filtering)
    run_ours(spec, spark)
    native.wait_synced()
    dbs15.assert_same(tables)  # the copy
    for batch in batches:
        publish(dbs15.publisher, batch)
        apply(spec, spark=spark)
        native.wait_caught_up()
        dbs15.assert_same(tables)
    assert set(engines) == {"process" if path == "source" else "spark"}, engines
