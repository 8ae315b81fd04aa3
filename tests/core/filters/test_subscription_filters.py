"""Combination rules of several publications (pgoutput.c get_rel_sync_entry, pgoutput_row_filter_init,
pgoutput_column_list_init; tablesync.c fetch_remote_table_info), against a real catalog."""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_rowfilter.core.errors import ColumnListConflictError, ReplicaIdentityError
from airflow_provider_rowfilter.core.publication.ddl import publications_from_ddl
from airflow_provider_rowfilter.core.publication.model import PublishAction as A
from airflow_provider_rowfilter.core.publication.subscription_filters import subscribed_tables, subscription_filters
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.publisher.catalog_reader import read_catalog

SCHEMA = """
CREATE TABLE t1 (a int PRIMARY KEY, b int, c text);
CREATE SCHEMA s2; CREATE TABLE s2.t2 (a int PRIMARY KEY, b int);
CREATE TABLE parent (id int, region text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE part_eu PARTITION OF parent FOR VALUES IN ('EU');
CREATE TABLE part_us PARTITION OF parent FOR VALUES IN ('US');
"""


@pytest.fixture
def catalog(fresh_db):
    with psycopg.connect(fresh_db(), autocommit=True) as conn:
        conn.execute(SCHEMA)
        return read_catalog(conn)


def resolve(catalog, ddl, names, **kw):
    return subscription_filters(publications_from_ddl(ddl, catalog), names, catalog, **kw)


T1 = TableName("public", "t1")


def test_filters_are_ored_per_action_and_publish_splits_them(catalog):
    # Filters are per action (pgoutput.c pgoutput_row_filter_init): pubA publishes insert with b < 2,
    # pubB publishes update with a > 1
    f = resolve(catalog, """
        CREATE PUBLICATION pa FOR TABLE t1 WHERE (b < 2) WITH (publish = 'insert');
        CREATE PUBLICATION pb FOR TABLE t1 WHERE (a > 1) WITH (publish = 'update');
    """, ["pa", "pb"]).tables[T1]
    assert f.actions == {A.INSERT, A.UPDATE}
    assert (f.filter_sql(A.INSERT), f.filter_sql(A.UPDATE)) == ("(b < 2)", "(a > 1)")
    assert f.copy_filter_sql == "(b < 2) OR (a > 1)"  # the copy ignores publish


def test_an_unfiltered_publication_removes_the_filter_only_for_its_actions(catalog):
    f = resolve(catalog, """
        CREATE PUBLICATION pf FOR TABLE t1 WHERE (a > 10);
        CREATE PUBLICATION pall FOR TABLE t1 WITH (publish = 'insert');
    """, ["pf", "pall"]).tables[T1]
    assert f.filters[A.INSERT] is None
    assert f.filter_sql(A.UPDATE) == "(a > 10)" and f.filter_sql(A.DELETE) == "(a > 10)"
    assert f.copy_filters is None


def test_truncate_only_publication_without_filter_makes_the_copy_unfiltered(catalog):
    # logical-replication.sgml, pub3a/pub3b: "some rows may be copied that would not be replicated"
    f = resolve(catalog, """
        CREATE PUBLICATION pub3a FOR TABLE t1 WITH (publish = 'truncate');
        CREATE PUBLICATION pub3b FOR TABLE t1 WHERE (a > 5);
    """, ["pub3a", "pub3b"]).tables[T1]
    assert f.copy_filters is None and f.filter_sql(A.INSERT) == "(a > 5)"


def test_schema_publication_overrides_a_tables_filter(catalog):
    f = resolve(catalog, """
        CREATE PUBLICATION ps FOR TABLES IN SCHEMA s2 WITH (publish = 'insert');
        CREATE PUBLICATION pt FOR TABLE s2.t2 WHERE (a > 1);
    """, ["ps", "pt"]).tables[TableName("s2", "t2")]
    assert f.filters[A.INSERT] is None and f.filter_sql(A.UPDATE) == "(a > 1)"


def test_different_column_lists_are_an_error_but_a_full_list_equals_none(catalog):
    with pytest.raises(ColumnListConflictError, match='different column lists for table "public.t1"'):
        resolve(catalog, "CREATE PUBLICATION p1 FOR TABLE t1 (a, b); CREATE PUBLICATION p2 FOR TABLE t1;",
                ["p1", "p2"])
    full = resolve(catalog, "CREATE PUBLICATION p1 FOR TABLE t1 (c, b, a); CREATE PUBLICATION p2 FOR TABLE t1;",
                   ["p1", "p2"])
    assert full.tables[T1].columns is None


def test_via_root_publishes_leaves_as_the_root_with_its_filter(catalog):
    ddl = "CREATE PUBLICATION pr FOR TABLE parent WHERE (id > 5) WITH (publish_via_partition_root = true)"
    f = resolve(catalog, ddl, ["pr"])
    assert list(f.tables) == [TableName("public", "parent")]
    assert f.tables[TableName("public", "parent")].leaves == (TableName("public", "part_eu"),
                                                               TableName("public", "part_us"))
    assert subscribed_tables(publications_from_ddl(ddl, catalog), ["pr"], catalog) == [TableName("public", "parent")]


def test_without_via_root_each_leaf_is_its_own_table(catalog):
    ddl = "CREATE PUBLICATION pl FOR TABLE parent"
    f = resolve(catalog, ddl, ["pl"])
    assert list(f.tables) == [TableName("public", "part_eu"), TableName("public", "part_us")]
    assert subscribed_tables(publications_from_ddl(ddl, catalog), ["pl"], catalog) == list(f.tables)


def test_filter_on_non_identity_column_is_rejected_when_updates_are_published(catalog):
    with pytest.raises(ReplicaIdentityError) as e:
        resolve(catalog, "CREATE PUBLICATION p FOR TABLE t1 WHERE (b > 1)", ["p"])
    assert (e.value.message, e.value.detail) == (
        'cannot update table "t1"', "Column used in the publication WHERE expression is not part of the replica identity.")
    # insert-only publications may filter on any column (CheckCmdReplicaIdentity checks UPDATE/DELETE only)
    assert resolve(catalog, "CREATE PUBLICATION p FOR TABLE t1 WHERE (b > 1) WITH (publish = 'insert')", ["p"])


def test_in_list_read_back_from_the_catalog_translates_like_the_ddl_file(fresh_db):
    # pg_get_expr shows `c IN ('x', 'y')` as `(c = ANY (ARRAY['x'::text, 'y'::text]))`
    from airflow_provider_rowfilter.core.filters.spark_translation import to_spark_sql
    from airflow_provider_rowfilter.publisher.catalog_reader import read_publications

    ddl = "CREATE PUBLICATION p FOR TABLE t1 WHERE (c IN ('x', 'y')) WITH (publish = 'insert')"
    with psycopg.connect(fresh_db(), autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(ddl)
        catalog, from_catalog = read_catalog(conn), read_publications(conn)
    spark = {to_spark_sql(f) for source in (from_catalog, publications_from_ddl(ddl, catalog))
             for f in subscription_filters(source, ["p"], catalog).tables[T1].filters[A.INSERT]}
    assert spark == {"`c` IN ('x', 'y')"}  # one translation for both sources


def test_generated_columns_published_as_postgresql_18_publishes_them(fresh_db):
    """pgoutput.c check_and_init_gencol / pgoutput_column_list_init: a stored generated column is published by
    publish_generated_columns = stored or by naming it in a list; publications without a list must agree on it."""
    with psycopg.connect(fresh_db(), autocommit=True) as conn:
        conn.execute("CREATE TABLE g (a int PRIMARY KEY, b int, g int GENERATED ALWAYS AS (a * 2) STORED)")
        catalog = read_catalog(conn)
    g = TableName("public", "g")
    ddl = """
        CREATE PUBLICATION pnone FOR TABLE g;
        CREATE PUBLICATION pstored FOR TABLE g WITH (publish_generated_columns = stored);
        CREATE PUBLICATION plist FOR TABLE g (a, g);
        CREATE PUBLICATION pfull FOR TABLE g (a, b, g);
    """
    assert resolve(catalog, ddl, ["pnone"]).tables[g].columns is None  # every column but the generated one
    assert resolve(catalog, ddl, ["pstored"]).tables[g].columns == ("a", "b", "g")
    assert resolve(catalog, ddl, ["plist"]).tables[g].columns == ("a", "g")
    assert resolve(catalog, ddl, ["pstored", "pfull"]).tables[g].columns == ("a", "b", "g")  # the same set
    with pytest.raises(ColumnListConflictError, match='different values of publish_generated_columns for table '
                                                      '"public.g" in different publications'):
        resolve(catalog, ddl, ["pnone", "pstored"])
