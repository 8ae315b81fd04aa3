"""flows/apply/net_effect.py's reading of a segment's relation layouts (the reduction itself is held against Spark's
and PostgreSQL's in tests/e2e/jobs/test_apply_random.py and test_apply_differential.py)."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_rowfilter.flows.apply.change_rows import layout_ids
from airflow_provider_rowfilter.flows.apply.net_effect import _toasted


def test_each_row_gets_its_relation_layout_and_a_relation_without_columns_has_none() -> None:
    names = pa.chunked_array([[["a", "b"], [], ["a", "b"]], [["a", "b", "c"], []]], pa.list_(pa.string()))
    ids, layouts = layout_ids(names)
    assert [layouts[i] for i in ids] == [("a", "b"), (), ("a", "b"), ("a", "b", "c"), ()]
    assert len(layouts) == 3


def test_only_rows_with_an_unchanged_toasted_value_are_listed_across_chunks() -> None:
    flags = pa.chunked_array([[[False, False], None, [False, True]], [[True], []]], pa.list_(pa.bool_()))
    assert _toasted(flags) == {2: [False, True], 3: [True]}
