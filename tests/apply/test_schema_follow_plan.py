"""What ``schema_changes: follow`` makes of a batch's relations (apply/schema_follow.py ``plan_changes``), without a
database: the relations as the change log records them, the publisher's catalog as ``pg_attribute`` would say."""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.apply.relation_checks import RelationSpan
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.flows.apply.schema_follow import PublisherColumn, SchemaChangeError, plan_changes, widens
from airflow_provider_rowfilter.subscriber.target_table import ApplyTarget, TargetColumn

T = TableName("public", "t")
TARGET = ApplyTarget(0, T, "r", (TargetColumn("id", "integer", None), TargetColumn("grp", "integer", None),
                                 TargetColumn("v", "text", None)), frozenset(), ("id",))


def span(names: str, types: str, lsn: int) -> RelationSpan:
    return RelationSpan(16400, "public", "t", tuple(names.split()), tuple(types.split(",")), lsn + 8, lsn + 8, lsn)


def col(attnum: int, name: str, type_sql: str = "text", *, dropped: bool = False, missing: str | None = None,
        default: str | None = None, const: bool = False, listed: bool = False) -> PublisherColumn:
    return PublisherColumn(attnum, name, dropped, type_sql, missing, missing is not None, default, const, listed)


BASE = [col(1, "id", "integer"), col(2, "grp", "integer")]


def plan(spans, catalog, mode="follow", target=TARGET):
    asked = []

    def publisher(oid):
        asked.append(oid)
        return catalog

    shaped, changes = plan_changes(mode, target, (T,), 0, spans, publisher)
    return shaped, [c.describe().split(" at ")[0] for c in changes], asked


def test_a_relation_like_the_table_asks_nothing_and_changes_nothing():
    shaped, changes, asked = plan([span("id grp v", "integer,integer,text", 100)], [])
    assert (shaped, changes, asked) == (TARGET, [], [])


def test_a_column_added_gets_what_the_publishers_rows_got():
    catalog = [*BASE, col(3, "v"), col(4, "extra", "integer", missing="7", default="7", const=True),
               col(5, "ts", "timestamp with time zone", missing="2026-12-02 10:00:00+00", default="now()")]
    shaped, changes, _ = plan([span("id grp v", "integer,integer,text", 100),
                               span("id grp v extra ts", "integer,integer,text,integer,timestamp with time zone", 200)],
                              catalog)
    assert changes == ["added column extra (integer)", "added column ts (timestamp with time zone)"]
    extra, ts = shaped.columns[3:]
    assert extra.default_sql == "'7'::integer" and ts.default_sql == "'2026-12-02 10:00:00+00'::timestamp with time zone"


@pytest.mark.parametrize(("column", "reason"), [
    (col(4, "extra", "double precision", default="random()"), "added with DEFAULT random()"),
    (col(4, "extra", "double precision", listed=True), "published"),
])
def test_a_column_whose_existing_values_only_the_publisher_has_stops(column, reason):
    with pytest.raises(SchemaChangeError, match=reason) as caught:
        plan([span("id grp v extra", "integer,integer,text,double precision", 200)], [*BASE, col(3, "v"), column])
    assert caught.value.lsn == 200 and "rowfilter reconcile --table public.t" in str(caught.value)


def test_a_rename_keeps_its_place_and_number():
    shaped, changes, _ = plan([span("id grp v2", "integer,integer,text", 200)], [*BASE, col(3, "v2")])
    assert changes == ["renamed column v to v2"] and shaped.column_names == ("id", "grp", "v2")


def test_a_drop_and_an_add_of_the_last_column_is_no_rename():
    catalog = [*BASE, col(3, "........pg.dropped.3........", dropped=True), col(4, "v2")]
    with pytest.raises(SchemaChangeError, match='column "v2" \\(text\\) added, or "v" renamed to it'):
        plan([span("id grp v2", "integer,integer,text", 200)], catalog)  # the relation before is not in the batch
    # With the relation before it in the batch: an add, and the old column kept or (follow_drops) dropped after.
    spans = [span("id grp v", "integer,integer,text", 100), span("id grp v2", "integer,integer,text", 200)]
    assert plan(spans, catalog)[1] == ["added column v2 (text)"]
    shaped, changes, _ = plan(spans, catalog, "follow_drops")
    assert changes == ["added column v2 (text)", "dropped column v"]
    assert "v" in shaped.column_names  # the batch's changes before the drop still carry it


def test_a_rename_with_changes_under_both_names_in_the_batch_stops():
    with pytest.raises(SchemaChangeError, match='column "v" renamed to "v2"'):
        plan([span("id grp v", "integer,integer,text", 100), span("id grp v2", "integer,integer,text", 200)],
             [*BASE, col(3, "v2")])


def test_types_widen_and_other_changes_stop():
    shaped, changes, asked = plan([span("id grp v", "integer,bigint,text", 100)], [])
    assert changes == ["changed column grp to bigint"] and asked == []
    assert shaped.columns[1].type_sql == "bigint"
    with pytest.raises(SchemaChangeError, match='column "v" changed from text to character varying\\(3\\)'):
        plan([span("id grp v", "integer,integer,text", 100),
              span("id grp v", "integer,integer,character varying(3)", 200)], [])
    # A type the subscriber chose itself (no relation before it in the batch): left to the apply, as with stop.
    assert plan([span("id grp v", "integer,integer,character varying(3)", 100)], [])[1] == []


def test_a_partitioned_target_is_left_to_stop():
    shaped, changes = plan_changes("follow", TARGET, (T, TableName("public", "t_2")), 0,
                                   [span("id grp v extra", "integer,integer,text,integer", 100)], lambda oid: [])
    assert (shaped, changes) == (TARGET, [])


def test_the_definitions_follow_a_rename_as_postgresqls_stored_filter_does():
    import sqlglot

    from airflow_provider_rowfilter.core.apply.plan import EpochRules
    from airflow_provider_rowfilter.flows.apply.schema_follow import renamed_rules

    rules = EpochRules(frozenset({"insert", "update"}), {"insert": sqlglot.parse_one("n > 50 AND abs(n) < 90 AND s <> 'n'"),
                                                         "update": None}, ("k", "n"), {"n": "integer", "s": "text"})
    # Renamed at 0/300: the epoch recorded at 0/100 reads the new name, the one recorded at 0/400 has it already.
    first, later = renamed_rules(T, (rules, rules), (0x100, 0x400), [(T, "n", "n2", "0/300"),
                                                                     (TableName("public", "u"), "s", "s2", "0/300")])
    assert first.filters["insert"].sql() == "n2 > 50 AND ABS(n2) < 90 AND s <> 'n'" and first.filters["update"] is None
    assert first.columns == ("k", "n2") and first.column_types == {"n2": "integer", "s": "text"}
    assert later == rules and rules.columns == ("k", "n")  # the recorded ones are left as they were


@pytest.mark.parametrize(("old", "new", "safe"), [
    ("integer", "bigint", True), ("smallint", "integer", True), ("bigint", "integer", False),
    ("character varying(5)", "character varying(9)", True), ("character varying(5)", "text", True),
    ("character varying(9)", "character varying(5)", False), ("character varying(5)", "character varying", True),
    ("numeric(5,2)", "numeric(7,2)", True), ("numeric(5,2)", "numeric(7,3)", False), ("numeric(5,2)", "numeric", True),
    ("numeric", "numeric(9,2)", False), ("text", "character varying(9)", False), ("integer", "text", False),
])
def test_widens(old, new, safe):
    assert widens(old, new) is safe
