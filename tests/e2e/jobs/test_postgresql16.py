"""PostgreSQL 16 as the publisher, beside a native PostgreSQL 16 subscription (the referee) on the same publisher.

The run's other tests hold us to PostgreSQL 18. These run a chosen subset of test_apply_differential.py's cases
on the ``pgserver`` wheel's 16.2 server (tests/conftest.py ``local_pg16``, started once, about 2 s): the
publish lists ORed across publications, a column list (captured unfiltered, judged by Spark), and a partitioned
table published via its root, each copied and then streamed. What 16 does differently is listed in docs/concepts.md ("Publisher
versions"), each with its test (the origins on 16: tests/e2e/jobs/test_origins.py).
"""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_rowfilter.flows.apply.drain import apply
from tests.e2e.jobs.apply_scenario import publish
from tests.e2e.jobs.databases import Databases, apply_path, names, run_ours
from tests.e2e.jobs.differential_cases import CASES

#: (case, apply path): cheap, and covering both capture modes and both reducers.
SUBSET = [("combination-publish-lists", "source"), ("column-list", "spark"), ("partition-via-root", "source")]


@pytest.fixture
def dbs16(fresh_db16, tmp_path):
    """:func:`tests.e2e.jobs.conftest.dbs` on the PostgreSQL 16 cluster."""
    databases = Databases(fresh_db16(), fresh_db16(), fresh_db16(), change_logs=tmp_path)
    yield databases
    for native in databases.natives:
        native.drop()


@pytest.mark.parametrize(("case", "path"), SUBSET, ids=[f"{c}-{p}" for c, p in SUBSET])
def test_apply_on_a_postgresql16_publisher_matches_native(dbs16, spark, monkeypatch, case, path):
    with psycopg.connect(dbs16.publisher, autocommit=True) as conn:
        assert conn.info.server_version // 10000 == 16
    publisher, subscriber, publications, tables, batches = CASES[case]
    filtering, engines = apply_path(monkeypatch, path)
    dbs16.create(publisher, subscriber)
    native = dbs16.subscribe_native(publications)
    spec = dbs16.spec(publications, f"ours16_{next(names)}", filtering)
    run_ours(spec, spark)
    dbs16.assert_same(tables)  # the copy
    for batch in batches:
        publish(dbs16.publisher, batch)
        apply(spec, spark=spark)
        native.wait_caught_up()
        dbs16.assert_same(tables)
    engine = "process" if path == "source" else "spark"
    assert set(engines) == {engine}, engines
