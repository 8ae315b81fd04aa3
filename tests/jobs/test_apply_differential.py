"""ApplyChanges against PostgreSQL's own logical replication, running beside ours on the same publisher.

Each case: the publisher's tables and publications in one database, a NATIVE subscription in a
second, ours (refresh + snapshot, then apply batches) in a third; the same changes are made on the
publisher; then every table must be equal, row for row, in its text form.
"""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_rowfilter.jobs.apply import apply
from tests.jobs.test_snapshot_differential import Databases, _names, run_ours

# The documentation's UPDATE-transformation example (logical-replication.sgml, "Row Filters"):
# t1 published WHERE (a > 5 AND c = 'NSW'); the primary key includes c so UPDATEs may filter on it.
DOC_TABLES = "CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a, c));"
DOC_PUBLISHER = DOC_TABLES + """
ALTER TABLE t1 REPLICA IDENTITY FULL;
INSERT INTO t1 VALUES (2, 102, 'NSW'), (3, 103, 'QLD'), (4, 104, 'VIC'), (5, 105, 'ACT'), (6, 106, 'NSW'),
                      (7, 107, 'NT'), (8, 108, 'QLD'), (9, 109, 'NSW');
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 AND c = 'NSW');
"""
DOC_STEPS = [
    "UPDATE t1 SET b = 999 WHERE a = 6",                # old and new match: UPDATE
    "UPDATE t1 SET a = 555 WHERE a = 2",                # only new matches: INSERT
    "UPDATE t1 SET c = 'VIC' WHERE a = 9",              # only old matches: DELETE
    "UPDATE t1 SET b = 0 WHERE a = 3",                  # neither: dropped
    "INSERT INTO t1 VALUES (10, 1, 'NSW'), (11, 2, 'VIC')",
    "DELETE FROM t1 WHERE a = 7 OR a = 10",
]


@pytest.fixture
def dbs(fresh_db):
    databases = Databases(fresh_db(), fresh_db(), fresh_db())
    yield databases
    for native in databases.natives:
        native.drop()


def publish(dsn: str, statements) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def test_update_transformation_example_step_by_step(dbs, spark):
    dbs.create(DOC_PUBLISHER, DOC_TABLES)
    native = dbs.subscribe_native(("p1",))
    spec = dbs.spec(("p1",), f"ours_{next(_names)}")
    run_ours(spec, spark)
    for step in DOC_STEPS:
        publish(dbs.publisher, [step])
        result = apply(spec, spark=spark)
        native.wait_caught_up()
        dbs.assert_same(("t1",))
    assert result.states == {"public.t1": "r"}
