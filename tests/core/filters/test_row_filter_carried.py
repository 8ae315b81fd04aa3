"""One row filter, parsed and validated once, carried as a typed object from its definition to the apply.

The differential test (test_row_filter_differential.py) holds the apply's expression against
PostgreSQL; these tests hold the path itself: the publication model keeps the validated filter, the
subscription reuses it, the refresh records the Spark tree, and the apply loads that tree (or, for a
document recorded before the trees, the Spark SQL text).
"""

from __future__ import annotations

import json

import psycopg
import pytest
import sqlglot
from sqlglot import exp

from airflow_provider_rowfilter.core.apply.plan import EpochRules, filter_expression
from airflow_provider_rowfilter.core.filters.row_filter import RowFilter
from airflow_provider_rowfilter.core.filters.spark_translation import spark_or
from airflow_provider_rowfilter.core.publication.ddl import publications_from_ddl
from airflow_provider_rowfilter.core.publication.model import Publication, PublicationSet, PublishedTable
from airflow_provider_rowfilter.core.publication.model import PublishAction as A
from airflow_provider_rowfilter.core.publication.subscription_filters import filters_document, subscription_filters
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.publisher.catalog_reader import read_catalog

T1 = TableName("public", "t1")


@pytest.fixture(scope="module")
def catalog(local_pg):
    dsn = local_pg.create_database("rowfilter_carried")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (a int PRIMARY KEY, b int, c text); ALTER TABLE t1 REPLICA IDENTITY FULL")
        yield read_catalog(conn)
    local_pg.drop_database("rowfilter_carried")


def test_a_publications_file_keeps_the_validated_filter_and_the_subscription_uses_it(catalog) -> None:
    pubs = publications_from_ddl("""
        CREATE PUBLICATION pa FOR TABLE t1 WHERE (a < 2);
        CREATE PUBLICATION pb FOR TABLE t1 WHERE (a > 10) WITH (publish = 'insert');
        CREATE PUBLICATION pc; ALTER PUBLICATION pc ADD TABLE t1 WHERE (a = 5);
    """, catalog)
    kept = {name: pubs[name].table_entry(T1).filter for name in ("pa", "pb", "pc")}
    assert all(isinstance(f, RowFilter) for f in kept.values())
    assert [kept[n].sql for n in ("pa", "pb", "pc")] == ["a < 2", "a > 10", "a = 5"]
    table = subscription_filters(pubs, ["pa", "pb"], catalog).tables[T1]
    # the very objects the publications file validated: no second parse, no second analysis
    assert table.filters[A.INSERT] == (kept["pa"], kept["pb"])
    assert all(a is b for a, b in zip(table.filters[A.INSERT], (kept["pa"], kept["pb"]), strict=True))
    assert table.filters[A.UPDATE][0] is kept["pa"]
    assert table.copy_filters[0] is kept["pa"] and table.copy_filters[1] is kept["pb"]


def test_a_publishers_filter_is_validated_once_for_every_use(catalog) -> None:
    # read from pg_publication_rel, the filter arrives as text: validated when first needed, then reused
    # by the replica-identity check, every action and the initial copy
    pubs = PublicationSet({"p": Publication("p", tables=(PublishedTable(T1, "a > 1"),))})
    table = subscription_filters(pubs, ["p"], catalog).tables[T1]
    first = table.filters[A.INSERT][0]
    assert first.sql == "a > 1"
    assert table.filters[A.UPDATE][0] is first and table.filters[A.DELETE][0] is first
    assert table.copy_filters[0] is first


def _document(catalog) -> dict:
    pubs = publications_from_ddl("""
        CREATE PUBLICATION pa FOR TABLE t1 WHERE (a > 5 AND c = 'NSW');
        CREATE PUBLICATION pb FOR TABLE t1 WHERE (b IS NULL) WITH (publish = 'insert');
    """, catalog)
    filters = subscription_filters(pubs, ["pa", "pb"], catalog)
    recorded = json.loads(json.dumps(filters_document(filters, "s", with_trees=True)))  # as jsonb keeps it
    return {"filters": filters, "entry": recorded["tables"][0]}


def test_the_refresh_records_the_spark_tree_and_the_apply_evaluates_that_tree(catalog) -> None:
    d = _document(catalog)
    entry, table = d["entry"], d["filters"].tables[T1]
    assert entry["spark_filters"]["insert"] == "(`a` > 5 AND `c` = 'NSW') OR (`b` IS NULL)"  # for people
    entry["spark_filters"] = {"insert": "FALSE", "update": "FALSE", "delete": "FALSE"}  # not what the apply reads
    rules = EpochRules.from_document(entry)
    assert rules.filters["insert"] == spark_or(table.filters[A.INSERT])  # the translated tree itself
    assert rules.filters["update"] == spark_or(table.filters[A.UPDATE])
    # ORed as trees: one OR node over the two parenthesised translations
    assert isinstance(rules.filters["insert"], exp.Or)
    assert rules.filters["insert"].sql(dialect="spark") == "(`a` > 5 AND `c` = 'NSW') OR (`b` IS NULL)"


def test_a_document_recorded_before_the_trees_is_read_from_its_spark_sql(catalog) -> None:
    entry = _document(catalog)["entry"]
    del entry["spark_filter_trees"]  # what this version recorded until now
    rules = EpochRules.from_document(entry)
    assert rules.filters["insert"] == sqlglot.parse_one(entry["spark_filters"]["insert"], dialect="spark")
    typed = filter_expression(rules.filters["update"], rules.column_types, lambda n: exp.column(f"v_{n}"))
    assert typed.sql(dialect="spark") == "(CAST(v_a AS INT) > 5 AND CAST(v_c AS STRING) = 'NSW')"
    assert rules.filters["update"].sql(dialect="spark") == "(`a` > 5 AND `c` = 'NSW')"  # not changed by the read
