"""core/publication/copy_definitions.py: what a refresh says of a table whose initial-copy filter or column list changed."""

from __future__ import annotations

from airflow_provider_rowfilter.core.publication.copy_definitions import copy_definition_changes
from airflow_provider_rowfilter.core.relation import TableName

T1, T2, T3 = TableName("public", "t1"), TableName("public", "t2"), TableName("public", "t3")


def _doc(**tables) -> dict:
    return {"tables": [{"table": f"public.{name}", "copy_filter": f, "columns": c} for name, (f, c) in tables.items()]}


def test_a_changed_filter_and_column_list_are_named():
    before = _doc(t1=("(a > 5)", None), t2=(None, ["a", "b"]), t3=("(x)", None))
    after = _doc(t1=("(a > 3)", None), t2=(None, None), t3=("(x)", None))
    assert copy_definition_changes(before, after, [T1, T2, T3]) == {
        T1: "its initial-copy filter changed from (a > 5) to (a > 3)",
        T2: "its column list changed from (a, b) to all columns",
    }


def test_only_tables_past_their_copy_and_in_both_refreshes():
    before = _doc(t1=("(a > 5)", None))
    after = _doc(t1=(None, None), t2=("(b)", None))
    assert copy_definition_changes(before, after, [T2]) == {}  # t1 not asked for (still in i); t2 is new
    assert copy_definition_changes(None, after, [T1, T2]) == {}  # a first refresh changes nothing
    assert copy_definition_changes(before, after, [T1]) == {T1: "its initial-copy filter changed from (a > 5) to all rows"}
