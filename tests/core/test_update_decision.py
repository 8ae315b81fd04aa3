from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.apply.update_decision import UPDATE_DECISION_TABLE, ChangeKind, decide_update


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (False, False, None),
        (False, True, ChangeKind.INSERT),
        (True, False, ChangeKind.DELETE),
        (True, True, ChangeKind.UPDATE),
        (None, True, ChangeKind.INSERT),  # NULL is no match (pgoutput_row_filter_exec_expr)
        (True, None, ChangeKind.DELETE),
        (None, None, None),
    ],
    ids=["neither", "new-only", "old-only", "both", "old-null", "new-null", "both-null"],
)
def test_update_with_old_row_follows_pgoutput_table(old, new, expected):
    assert decide_update(old, new) is expected


@pytest.mark.parametrize(("new", "expected"), [(True, ChangeKind.UPDATE), (False, None), (None, None)])
def test_update_without_old_row_is_never_transformed(new, expected):
    assert decide_update(None, new, old_row_present=False) is expected


def test_decision_table_is_derived_from_the_rule():
    assert UPDATE_DECISION_TABLE == {
        (False, False): None, (False, True): ChangeKind.INSERT,
        (True, False): ChangeKind.DELETE, (True, True): ChangeKind.UPDATE,
    }
