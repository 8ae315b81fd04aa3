"""numeric's NaN and infinities beside native logical replication (issue 49), where Spark does the work.

A numeric(12,3) amount published WHERE (amount >= 0): NaN sorts above every number and equals itself (numeric.c
cmp_numerics), so native replicates a NaN row; Spark's DECIMAL holds no NaN, and the apply's cast raised
CAST_INVALID_INPUT for every batch that held one, until someone skipped the transaction (dropping the row).
tests/e2e/jobs/differential_cases.py ``numeric-nan-and-infinities`` holds both capture modes to native
(test_apply_differential.py); here the same publications come from a file (so Spark judges, as in the issue),
the copy is split in Spark tasks, and a verify compares the tables on Spark, NaN, ±Infinity, -0 and the types'
limits as the publisher's text.
"""

from __future__ import annotations

import dataclasses

from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.table_sync.sync import CopyOptions
from airflow_provider_rowfilter.flows.verify import comparison
from airflow_provider_rowfilter.flows.verify.verify import verify
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.apply_scenario import publish
from tests.e2e.jobs.databases import names, run_ours
from tests.e2e.jobs.differential_cases import (
    NUMERIC_BATCHES,
    NUMERIC_DDL,
    NUMERIC_PUBLICATIONS,
    NUMERIC_PUBLISHER,
    NUMERIC_TABLES,
)

TABLES = ("ledger", "keyed", "measures")
# Enough rows for the copy to be split in several Spark tasks (CopyOptions(min_pages=1)): every tenth a NaN.
FILLER = """
INSERT INTO ledger SELECT g, CASE WHEN g % 10 = 0 THEN 'NaN' ELSE (g % 7 - 3) * 1.125 END, g, g, g % 100, g
FROM generate_series(100, 3099) g;
"""


def test_publications_from_a_file_judged_by_spark_replicate_numeric_specials_as_native(dbs, spark, tmp_path):
    """The issue's case: the definitions from a publications file, so the apply judges on Spark; every table ends as
    native's, NaN rows in, the NaN key found, an unconstrained numeric's ±Infinity carried as text."""
    ddl = tmp_path / "publications.sql"
    ddl.write_text(NUMERIC_DDL)
    dbs.create(NUMERIC_PUBLISHER, NUMERIC_TABLES)
    native = dbs.subscribe_native(NUMERIC_PUBLICATIONS)
    spec = dataclasses.replace(dbs.spec(NUMERIC_PUBLICATIONS, f"numeric_{next(names)}"), publications_ddl=str(ddl))
    run_ours(spec, spark)
    native.wait_synced()
    dbs.assert_same(TABLES)
    assert "(2,NaN,-Infinity," in " ".join(table_rows(dbs.ours, "ledger"))  # NaN >= 0: copied
    for batch in NUMERIC_BATCHES:
        publish(dbs.publisher, batch)
        result = apply(spec, spark=spark)
        native.wait_caught_up()
        dbs.assert_same(TABLES)
    assert set(result.states.values()) == {"r"}
    assert "(3,NaN,NaN,0,-999.99,-Infinity)" in table_rows(dbs.ours, "ledger")  # UPDATE into the filter: INSERT


def test_a_split_copy_and_a_verify_on_spark_carry_numeric_specials(dbs, spark, monkeypatch):
    """The copy split in Spark tasks streams each value as the publisher's COPY text; the verify's readers run as
    Spark tasks and match the differing rows by key on Spark: an equal table is clean, a NaN changed to 0 on the
    subscriber is found."""
    dbs.create(NUMERIC_PUBLISHER + FILLER, NUMERIC_TABLES)
    native = dbs.subscribe_native(NUMERIC_PUBLICATIONS)
    spec = dbs.spec(NUMERIC_PUBLICATIONS, f"numeric_{next(names)}", "spark")
    copied = run_ours(spec, spark, CopyOptions(max_partitions=3, min_pages=1))
    assert max(t.partitions or 1 for t in copied.tables) > 1, copied.summary()
    native.wait_synced()
    dbs.assert_same(TABLES)

    monkeypatch.setattr(comparison, "LOCAL_PAGES", 0)  # every table read by Spark tasks
    equal = verify(spec, spark=spark)
    assert equal.clean, equal
    publish(dbs.ours, ["UPDATE ledger SET amount = 0 WHERE id = 2", "DELETE FROM keyed WHERE k = 'NaN'"])
    found = {t.table: t for t in verify(spec, spark=spark).tables}
    assert (found["public.ledger"].different, found["public.ledger"].examples) == (1, {"different": ["(2)"]})
    assert (found["public.keyed"].missing, found["public.keyed"].examples) == (1, {"missing": ["(NaN)"]})
