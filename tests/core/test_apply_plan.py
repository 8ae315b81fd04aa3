"""What one apply batch evaluates (core/apply/plan.py): epochs, rules, filter expressions, relation checks."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from airflow_provider_rowfilter.core.apply.plan import (
    ApplyPlan,
    EpochRules,
    TargetPlan,
    epochs_from_history,
    filter_expression,
)
from airflow_provider_rowfilter.core.apply.relation_checks import (
    IdentitySpan,
    RelationChangedError,
    RelationSpan,
    check_identities,
    check_relations,
)
from airflow_provider_rowfilter.core.errors import UntranslatableFilterError
from airflow_provider_rowfilter.core.relation import TableName

T = TableName("public", "t")


def document(filter_: str | None = "n > 10", *, columns=None, table: str = "public.t", leaves=("public.t",),
             actions=("insert", "update", "delete", "truncate")) -> dict:
    """A refresh_history document for one table."""
    return {"tables": [{"table": table, "leaves": list(leaves), "actions": list(actions), "columns": columns,
                        "spark_filters": dict.fromkeys(("insert", "update", "delete"), filter_),
                        "filter_column_types": {"n": "integer"} if filter_ else {}}]}


@pytest.mark.parametrize(("since", "starts"), [(0x05, (0x10, 0x20, 0x30)), (0x10, (0x10, 0x20, 0x30)),
                                               (0x25, (0x20, 0x30)), (0x30, (0x30,)), (0x40, (0x30,))],
                         ids=["before-all", "at-first", "inside-second", "at-last", "after-all"])
def test_epochs_keep_the_refresh_in_force_at_since_and_every_later_one(since, starts):
    history = [("0/30", {"at": 3}), ("0/10", {"at": 1}), ("0/20", {"at": 2})]  # any order
    epochs = epochs_from_history(history, since)
    assert epochs.starts == starts
    assert [d["at"] for d in epochs.documents] == [s >> 4 for s in starts]


def test_no_history_no_epochs():
    epochs = epochs_from_history([], 0)
    assert (epochs.starts, epochs.documents) == ((), ())


def test_rules_per_epoch_none_where_not_subscribed():
    epochs = epochs_from_history([("0/10", document()), ("0/20", document(table="public.other")),
                                  ("0/30", document(None, columns=["id", "n"], actions=("insert",)))], 0)
    first, second, third = epochs.rules(T)
    assert (first.actions, first.columns, first.column_types) == (
        frozenset({"insert", "update", "delete", "truncate"}), None, {"n": "integer"})
    assert {a: f.sql(dialect="spark") for a, f in first.filters.items() if f is not None} == dict.fromkeys(
        ("insert", "update", "delete"), "n > 10")
    assert second is None
    # recorded before the numeric reads were named: its filters read numeric as a bare DECIMAL
    assert third == EpochRules(frozenset({"insert"}), {"insert": None}, ("id", "n"), {}, numeric_specials=False)
    assert first.publishes_column("anything") and third.publishes_column("n") and not third.publishes_column("a")


def test_leaves_from_the_newest_epoch_that_publishes_the_table():
    epochs = epochs_from_history([("0/10", document(leaves=("public.t_1", "public.t_2"))),
                                  ("0/20", document(leaves=("public.t_1",))),
                                  ("0/30", document(table="public.other"))], 0)
    assert epochs.leaves(T) == (TableName("public", "t_1"),)
    assert epochs.leaves(TableName("public", "nowhere")) == (TableName("public", "nowhere"),)


def test_filter_expression_reads_each_column_cast_to_its_type():
    tree = filter_expression(sqlglot.parse_one("n > 10 AND m IS NULL", dialect="spark"), {"n": "integer", "m": "numeric(10,2)"},
                             lambda name: exp.column(f"v_{name}"))
    # numeric: a struct of a DOUBLE saying NaN/±Infinity (0 for a number) and the DECIMAL (core/filters/spark_numeric.py)
    assert tree.sql(dialect="spark") == (
        "CAST(v_n AS INT) > 10 AND CASE WHEN v_m IS NULL THEN CAST(NULL AS STRUCT<k: DOUBLE, v: DECIMAL(10, 2)>) "
        "ELSE NAMED_STRUCT('k', CASE v_m WHEN 'NaN' THEN CAST('NaN' AS DOUBLE) WHEN 'Infinity' THEN "
        "CAST('Infinity' AS DOUBLE) WHEN '-Infinity' THEN CAST('-Infinity' AS DOUBLE) ELSE CAST(0 AS DOUBLE) END, "
        "'v', CAST(CASE WHEN v_m IN ('NaN', 'Infinity', '-Infinity') THEN NULL ELSE v_m END AS DECIMAL(10, 2))) "
        "END IS NULL")


def test_filter_expression_of_a_document_recorded_before_numeric_specials_reads_a_decimal():
    """A document without ``numeric_reads`` holds filters that compute with a bare DECIMAL: read so, and NaN or an
    infinity raises naming the column and the fix, where Spark's own cast raised CAST_INVALID_INPUT."""
    entry = {"table": "public.t", "actions": ["insert"], "filters": {"insert": "m > 1"},
             "spark_filters": {"insert": "m > 1"}, "columns": None, "filter_column_types": {"m": "numeric(10,2)"}}
    rules = EpochRules.from_document(entry)
    assert not rules.numeric_specials
    assert EpochRules.from_document({**entry, "numeric_reads": "struct"}).numeric_specials
    tree = filter_expression(rules.filters["insert"], rules.column_types, lambda name: exp.column(f"v_{name}"),
                             numeric_specials=rules.numeric_specials)
    text = tree.sql(dialect="spark")
    assert text.startswith("CASE WHEN v_m IN ('NaN', 'Infinity', '-Infinity') THEN RAISE_ERROR(CONCAT("
                           "'the filter column \"m\" holds ', v_m, "), text
    assert text.endswith("ELSE CAST(v_m AS DECIMAL(10, 2)) END > 1")
    assert "run `rowfilter refresh`" in text


def test_filter_expression_refuses_a_column_without_a_recorded_type():
    with pytest.raises(UntranslatableFilterError, match='the filter column "m" has no recorded type') as raised:
        filter_expression(sqlglot.parse_one("m > 1", dialect="spark"), {"n": "integer"}, exp.column)
    assert "rowfilter refresh" in raised.value.hint


# ---- check_relations ----------------------------------------------------------------------------------

def span(table: str = "t", columns=("id", "n"), first: int = 0x100, last: int = 0x200, oid: int = 1) -> RelationSpan:
    return RelationSpan(oid, "public", table, tuple(columns), ("integer",) * len(columns), first, last, first - 8)


def plan_and_epochs(position: int = 0, filter_: str | None = "n > 10"):
    epochs = epochs_from_history([("0/10", document(filter_))], 0)
    target = TargetPlan(0, T, (T,), position, ("id", "n"), ("id",), epochs.rules(T))
    return ApplyPlan(epochs.starts, (target,)), epochs


def no_names(oids):
    raise AssertionError(f"the publisher was asked for {oids}")


def test_relations_as_defined_pass():
    plan, epochs = plan_and_epochs()
    check_relations(plan, epochs, [span()], 0, no_names)


def test_a_renamed_table_stops_the_batch_naming_both_names():
    plan, epochs = plan_and_epochs()
    with pytest.raises(RelationChangedError, match='target relation "public.t2" does not exist') as raised:
        check_relations(plan, epochs, [span(last=0x150), span("t2", first=0x180, last=0x200)], 0, no_names)
    assert raised.value.lsn == 0x180
    assert "renamed to public.t2 (OID 1)" in raised.value.hint


def test_a_renamed_table_is_named_by_the_publisher_when_the_batch_does_not_know_its_oid():
    plan, epochs = plan_and_epochs()
    asked = []

    def names(oids):
        asked.append(list(oids))
        return {1: T}
    with pytest.raises(RelationChangedError, match='"public.t2" does not exist'):
        check_relations(plan, epochs, [span("t2")], 0, names)
    assert asked == [[1]]


def test_changes_before_the_position_are_not_due():
    plan, epochs = plan_and_epochs(position=0x300)
    check_relations(plan, epochs, [span("t2"), span(columns=("id",))], 0x300, no_names)


def test_a_filter_column_lost_on_the_publisher_stops_the_batch():
    plan, epochs = plan_and_epochs()
    with pytest.raises(RelationChangedError, match='missing column "n" read by the subscription\'s row filter'):
        check_relations(plan, epochs, [span(columns=("id", "m"))], 0, no_names)


def test_an_unfiltered_table_does_not_need_the_column():
    plan, epochs = plan_and_epochs(filter_=None)
    check_relations(plan, epochs, [span(columns=("id", "m"))], 0, no_names)


def identity(kind: str = "update", ri: str = "d", key=("id",), first: int = 0x100) -> IdentitySpan:
    return IdentitySpan("public", "t", kind, ri, tuple(key), first, first + 0x100, first - 8)


def test_an_update_whose_identity_does_not_cover_the_filter_stops_with_postgresql_s_error():
    plan, epochs = plan_and_epochs()
    check_identities(plan, epochs, lambda: [identity(ri="f", key=("id", "n")), identity(key=("id", "n"))])
    with pytest.raises(RelationChangedError, match='cannot delete from table "t"') as raised:
        check_identities(plan, epochs, lambda: [identity("update", first=0x300), identity("delete", first=0x100)])
    assert "not part of the replica identity" in raised.value.detail and raised.value.lsn == 0x100


def test_a_column_list_that_does_not_cover_the_identity_stops_and_nothing_is_read_without_old_rows():
    epochs = epochs_from_history([("0/10", document(None, columns=["id", "n"]))], 0)
    plan = ApplyPlan(epochs.starts, (TargetPlan(0, T, (T,), 0, ("id", "n"), ("id",), epochs.rules(T)),))
    with pytest.raises(RelationChangedError, match="Column list used by the publication does not cover"):
        check_identities(plan, epochs, lambda: [identity(ri="f", key=("id", "n", "w"))])
    plan, epochs = plan_and_epochs(filter_=None)
    check_identities(plan, epochs, lambda: no_names([]))  # no filter, no list: the log is not read
