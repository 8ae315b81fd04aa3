"""PostgreSQL 19's publication statements in a publications file (core/publication/ddl.py), against a real catalog.

No PostgreSQL 19 server can be had here, so the rules and texts are held to 19's source (gram.y
``pub_all_obj_type_list``, ``opt_pub_except_clause``, ``pub_except_obj_list``; publicationcmds.c
``CreatePublication``, ``CheckAlterPublication``, ``AlterPublicationTables``, ``AlterPublicationAllFlags``;
pg_publication.c ``check_publication_add_relation``, ``GetAllPublicationRelations``,
``is_table_publishable_in_publication``; its regression test publication.sql) and the catalog is a PostgreSQL 18
one: a file is read for any publisher (the file, not the publisher, defines the publications). What the
subscription then replicates of them is held to the publisher's rows end to end in
tests/e2e/jobs/test_publications_file_19.py.
"""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_rowfilter.core.errors import PublicationError, PublicationSyntaxError
from airflow_provider_rowfilter.core.publication.ddl import publications_from_ddl
from airflow_provider_rowfilter.core.publication.subscription_filters import subscribed_tables, subscription_filters
from airflow_provider_rowfilter.core.relation import TableName

SCHEMA = """
CREATE TABLE t1 (a int PRIMARY KEY); CREATE TABLE t2 (a int PRIMARY KEY); CREATE TABLE t3 (a int PRIMARY KEY);
CREATE SCHEMA s; CREATE TABLE s.t4 (a int PRIMARY KEY);
CREATE TABLE parent (a int PRIMARY KEY); CREATE TABLE child (b text, PRIMARY KEY (a)) INHERITS (parent);
CREATE TABLE root (a int PRIMARY KEY) PARTITION BY RANGE (a);
CREATE TABLE part1 PARTITION OF root FOR VALUES FROM (0) TO (100);
CREATE TABLE part2 PARTITION OF root FOR VALUES FROM (100) TO (200);
CREATE VIEW v AS SELECT 1 AS x; CREATE UNLOGGED TABLE scratch (a int); CREATE SEQUENCE seq1;
"""
ALL = {TableName("public", n) for n in ("t1", "t2", "t3", "parent", "child", "part1", "part2")} | {
    TableName("s", "t4")}


@pytest.fixture(scope="module")
def catalog(local_pg):
    from airflow_provider_rowfilter.publisher.catalog_reader import read_catalog

    dsn = local_pg.create_database("t_publication_ddl_19")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            yield read_catalog(conn)
    finally:
        local_pg.drop_database("t_publication_ddl_19")


def tables(catalog, ddl: str, *names: str) -> set[TableName]:
    return set(subscribed_tables(publications_from_ddl(ddl, catalog), names or ["p"], catalog))


def refused(catalog, ddl: str) -> PublicationError:
    with pytest.raises(PublicationError) as raised:
        publications_from_ddl(ddl, catalog)
    return raised.value


def test_all_tables_except_leaves_the_listed_tables_out_with_their_inheritance_children(catalog):
    assert tables(catalog, "CREATE PUBLICATION p FOR ALL TABLES") == ALL
    # The first table needs TABLE, the others may go without (5984ea868); a schema-qualified one; duplicates dropped.
    assert tables(catalog, "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE t1, t2, TABLE s.t4, t1)") == \
        ALL - {TableName("public", "t1"), TableName("public", "t2"), TableName("s", "t4")}
    child, parent = TableName("public", "child"), TableName("public", "parent")
    assert tables(catalog, "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE parent)") == ALL - {parent, child}
    assert tables(catalog, "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE parent *)") == ALL - {parent, child}
    assert tables(catalog, "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE ONLY parent)") == ALL - {parent}
    assert tables(catalog, "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE ONLY (parent))") == ALL - {parent}


def test_a_partition_tree_is_excluded_at_its_root_published_via_root_or_not(catalog):
    parts = {TableName("public", "part1"), TableName("public", "part2")}
    assert tables(catalog, "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE root)") == ALL - parts
    via_root = "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE t1) WITH (publish_via_partition_root = true)"
    assert tables(catalog, via_root) == (ALL - parts - {TableName("public", "t1")}) | {TableName("public", "root")}
    assert tables(catalog, via_root.replace("(TABLE t1)", "(TABLE root)")) == ALL - parts
    e = refused(catalog, "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE part1)")
    assert (e.message, e.detail) == ('cannot specify relation "public.part1" in the publication EXCEPT clause',
                                     "This operation is not supported for individual partitions.")


def test_an_excluded_table_is_neither_subscribed_nor_filtered_and_another_publication_still_publishes_it(catalog):
    publications = publications_from_ddl("""
        CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE t1, t2);
        CREATE PUBLICATION q FOR TABLE t1 WHERE (a > 10);
    """, catalog)
    f = subscription_filters(publications, ["p"], catalog)
    assert TableName("public", "t1") not in f.tables and TableName("public", "t3") in f.tables
    both = subscription_filters(publications, ["p", "q"], catalog).tables
    t1 = both[TableName("public", "t1")]
    assert t1.copy_filter_sql == "(a > 10)" and t1.publications == ("q",)  # p excludes it: q's filter holds
    assert TableName("public", "t2") not in both


@pytest.mark.parametrize(("ddl", "message", "detail"), [
    ("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE v)", 'cannot specify relation "public.v" in the publication '
     "EXCEPT clause", "This operation is not supported for views."),
    ("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE scratch)", 'cannot specify relation "public.scratch" in the '
     "publication EXCEPT clause", "This operation is not supported for unlogged tables."),
    ("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE seq1)", 'cannot specify relation "public.seq1" in the '
     "publication EXCEPT clause", "This operation is not supported for sequences."),
    ("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE nosuch)", 'relation "nosuch" does not exist', None),
    ("CREATE PUBLICATION p FOR ALL TABLES, ALL TABLES", "invalid publication object list",
     "ALL TABLES can be specified only once."),
    ("CREATE PUBLICATION p FOR ALL SEQUENCES, ALL TABLES, ALL SEQUENCES", "invalid publication object list",
     "ALL SEQUENCES can be specified only once."),
])
def test_what_postgresql_19_refuses_in_an_except_list_or_an_all_list(catalog, ddl, message, detail):
    e = refused(catalog, ddl)
    assert (e.message, e.detail) == (message, detail)


@pytest.mark.parametrize(("ddl", "near"), [
    ("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (t1, t2)", "t1"),  # the first table needs TABLE
    ("CREATE PUBLICATION p FOR ALL TABLES EXCEPT TABLE t1", "TABLE"),  # the parentheses (5984ea868)
    ("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE t1 (a))", "("),  # relation_expr: no column list
    ("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE t1 WHERE (a > 1))", "WHERE"),  # nor WHERE
    ("CREATE PUBLICATION p FOR ALL TABLES, TABLE t1", "TABLE"),
    ("CREATE PUBLICATION p FOR TABLE t1 EXCEPT (TABLE t2)", "EXCEPT"),
    ("CREATE PUBLICATION p; ALTER PUBLICATION p ADD ALL TABLES", "ALL"),  # ADD and DROP take pub_obj_list only
    ("CREATE PUBLICATION p FOR TABLE t1; ALTER PUBLICATION p ADD TABLE t2 EXCEPT (TABLE t3)", "EXCEPT"),
    ("CREATE PUBLICATION p FOR TABLE t1; ALTER PUBLICATION p DROP TABLE t1 EXCEPT (TABLE t3)", "EXCEPT"),
    ("CREATE PUBLICATION p; ALTER PUBLICATION p SET ALL TABLES EXCEPT ()", ")"),
])
def test_except_syntax_errors_are_postgresql_19s(catalog, ddl, near):
    with pytest.raises(PublicationSyntaxError) as raised:
        publications_from_ddl(ddl, catalog)
    assert raised.value.message == f'syntax error at or near "{near}"'



def test_set_all_tables_replaces_or_clears_the_except_list_and_a_table_that_leaves_it_joins(catalog):
    t1, t2, t3 = (TableName("public", n) for n in ("t1", "t2", "t3"))
    create = "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE t1, t2);"
    assert tables(catalog, create) == ALL - {t1, t2}
    assert tables(catalog, create + "ALTER PUBLICATION p SET ALL TABLES EXCEPT (TABLE t3)") == ALL - {t3}
    assert tables(catalog, create + "ALTER PUBLICATION p SET ALL TABLES") == ALL  # EXCEPT left out: cleared
    # An empty publication may become FOR ALL TABLES; SET ALL SEQUENCES turns ALL TABLES off (both flags are set).
    assert tables(catalog, "CREATE PUBLICATION p; ALTER PUBLICATION p SET ALL TABLES EXCEPT (TABLE t1)") == ALL - {t1}
    seqs = publications_from_ddl(create + "ALTER PUBLICATION p SET ALL SEQUENCES", catalog)["p"]
    assert (seqs.all_tables, seqs.all_sequences, seqs.except_tables) == (False, True, ())
    both = publications_from_ddl("CREATE PUBLICATION p; ALTER PUBLICATION p SET ALL TABLES, ALL SEQUENCES",
                                 catalog)["p"]
    assert (both.all_tables, both.all_sequences) == (True, True)


@pytest.mark.parametrize(("setup", "alter", "message", "detail"), [
    ("CREATE PUBLICATION p FOR TABLE t1", "SET ALL TABLES EXCEPT (TABLE t2)",
     'publication "p" does not support ALL TABLES operations',
     "This operation requires the publication to be defined as FOR ALL TABLES/SEQUENCES or to be empty."),
    ("CREATE PUBLICATION p FOR TABLES IN SCHEMA s", "SET ALL SEQUENCES",
     'publication "p" does not support ALL SEQUENCES operations',
     "This operation requires the publication to be defined as FOR ALL TABLES/SEQUENCES or to be empty."),
    ("CREATE PUBLICATION p FOR ALL SEQUENCES", "ADD TABLE t1", 'publication "p" is defined as FOR ALL SEQUENCES',
     "Tables or sequences cannot be added to or dropped from FOR ALL SEQUENCES publications."),
    ("CREATE PUBLICATION p FOR ALL SEQUENCES", "ADD TABLES IN SCHEMA s",
     'publication "p" is defined as FOR ALL SEQUENCES',
     "Schemas cannot be added to or dropped from FOR ALL SEQUENCES publications."),
    ("CREATE PUBLICATION p FOR ALL TABLES, ALL SEQUENCES", "DROP TABLE t1",
     'publication "p" is defined as FOR ALL TABLES, ALL SEQUENCES',
     "Tables or sequences cannot be added to or dropped from FOR ALL TABLES, ALL SEQUENCES publications."),
    # The EXCEPT list is no membership: DROP TABLE of an excluded table is refused as any table of FOR ALL TABLES
    # (18's words on an 18 publisher: tests/core/fixtures/publication_cases.yaml alltables-drop-table).
    ("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE t1)", "DROP TABLE t1",
     'publication "p" is defined as FOR ALL TABLES',
     "Tables cannot be added to or dropped from FOR ALL TABLES publications."),
])
def test_what_postgresql_19_refuses_in_alter_publication(catalog, setup, alter, message, detail):
    e = refused(catalog, f"{setup}; ALTER PUBLICATION p {alter}")
    assert (e.message, e.detail) == (message, detail)


def test_a_19_publisher_gets_19s_words_for_a_table_of_a_for_all_tables_publication(catalog):
    from dataclasses import replace

    e = refused(replace(catalog, server_version_num=190000),
                "CREATE PUBLICATION p FOR ALL TABLES; ALTER PUBLICATION p ADD TABLE t1")
    assert e.detail == "Tables or sequences cannot be added to or dropped from FOR ALL TABLES publications."


def test_for_all_sequences_publishes_no_table(catalog):
    publications = publications_from_ddl("CREATE PUBLICATION p FOR ALL SEQUENCES WITH (publish = 'insert')", catalog)
    assert publications["p"].all_sequences and not publications["p"].all_tables
    assert tables(catalog, "CREATE PUBLICATION p FOR ALL SEQUENCES") == set()
