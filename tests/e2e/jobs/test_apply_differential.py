"""ApplyChanges against PostgreSQL's own logical replication, running beside ours on the same publisher.

Each case: the publisher's tables and publications in one database, a NATIVE subscription in a
second, ours (refresh + snapshot, then apply batches) in a third; the same changes are made on the
publisher; then every table must be equal, row for row, in its text form. On PostgreSQL 18, and on 17 for
one of the three paths (:data:`RUNS`).
"""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.change_log.log import ChangeLog
from airflow_provider_rowfilter.change_log.segment_reader import segment_filtering
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.publisher.capture_objects import capture_publications
from tests.e2e.jobs.apply_scenario import publish
from tests.e2e.jobs.databases import APPLY_PATHS, FILTERING_MODES, apply_path, names, run_ours
from tests.e2e.jobs.differential_cases import CASES, DOC_PUBLISHER, DOC_STEPS, DOC_TABLES


@pytest.fixture(autouse=True)
def _as_password_roles(dbs, cluster_roles, monkeypatch):
    """Every spec here connects as the run's password roles (tests/roles.py), their passwords in the environment."""
    dbs.authenticate_as(cluster_roles, monkeypatch)


def assert_captured_as(spec, filtering: str) -> None:
    """Every segment of the change log was captured in ``filtering`` mode, and our capture publications exist
    only where the slot is read through them (spark)."""
    segments = ChangeLog(spec.change_log_dir()).segments()
    assert segments and {segment_filtering(s.path) for s in segments} == {filtering}
    with connect(spec.publisher, "publisher", spec) as conn:
        assert bool(capture_publications(conn, spec.subscription)) == (filtering == "spark")


@pytest.mark.parametrize("filtering", FILTERING_MODES)
def test_update_transformation_example_step_by_step(dbs, spark, filtering):
    dbs.create(DOC_PUBLISHER, DOC_TABLES)
    native = dbs.subscribe_native(("p1",))
    spec = dbs.spec(("p1",), f"ours_{next(names)}", filtering)
    run_ours(spec, spark)
    persistent = spark.sparkContext._jsc.sc().getPersistentRDDs
    before = persistent().size()  # the session is shared: what earlier tests left is not this test's
    for step in DOC_STEPS:
        publish(dbs.publisher, [step])
        result = apply(spec, spark=spark)
        native.wait_caught_up()
        dbs.assert_same(("t1",))
        # The batch's checkpointed rows are dropped when it ends, not left to the JVM's garbage collector.
        assert persistent().size() == before
    assert result.states == {"public.t1": "r"}
    assert_captured_as(spec, filtering)


#: The cases that need PostgreSQL 18 (publish_generated_columns): every path of theirs runs on 18.
NEEDS_18 = frozenset({"generated-columns"})
#: Each case on each path, on PostgreSQL 18 but for one path of each case, which runs on PostgreSQL 17 (publisher,
#: ours and the native referee) where the case can: Spark judging (``spark``) for every other case, the publisher
#: filtering and Spark reducing (``source-reduced-by-spark``) for the others. 17 takes part in every case, in both
#: capture modes, at no cost but its cluster's start; the in-process path stays on 18 for every case.
RUNS = [(name, path, 17 if name not in NEEDS_18 and path == ("spark", "source-reduced-by-spark")[i % 2] else 18)
        for i, name in enumerate(CASES) for path in APPLY_PATHS]


# --- more of PostgreSQL's rules, each case: (publisher DDL+rows, subscriber DDL, publications, batches of SQL)
@pytest.mark.parametrize(("case", "path", "pg_version"), [(CASES[n], p, v) for n, p, v in RUNS],
                         ids=[f"{n}-{p}-pg{v}" for n, p, v in RUNS])
def test_apply_matches_native_logical_replication(dbs, spark, monkeypatch, case, path, pg_version):
    publisher, subscriber, publications, tables, batches = case
    filtering, engines = apply_path(monkeypatch, path)
    dbs.create(publisher, subscriber)
    native = dbs.subscribe_native(publications)
    spec = dbs.spec(publications, f"ours_{next(names)}", filtering)
    run_ours(spec, spark)
    for batch in batches:
        publish(dbs.publisher, batch)
        apply(spec, spark=spark)
        native.wait_caught_up()
        dbs.assert_same(tables)
    assert_captured_as(spec, filtering)
    # Every batch with a change was reduced by the path's engine (an empty one by neither).
    engine = "process" if path == "source" else "spark"
    assert set(engines) == {engine} and engines[engine] >= len(batches) - 1, engines
    with connect(spec.publisher, "publisher", spec) as conn:
        assert conn.info.server_version // 10000 == pg_version
