"""core/apply/fold_rules.py: the table every reducer derives its fold from. What each rule means is held by the truth
table in every engine (tests/apply/test_fold.py); here, that the table is whole and that its derived forms
keep the kernels' fast paths."""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.apply.fold_rules import (
    OPERATIONS,
    RepeatedUpdates,
    Step,
    repeated_updates,
    single_flags,
    step,
    steps,
)
from airflow_provider_rowfilter.core.spec.values import CONFLICT_POLICIES


@pytest.mark.parametrize("policy", CONFLICT_POLICIES)
def test_every_operation_has_a_rule_from_both_starts(policy):
    rules = steps(policy)
    assert set(rules) == {(op, present) for op in OPERATIONS for present in (True, False)}
    # a DELETE never leaves a row, an INSERT always does; what is counted is a change that found no row
    for (op, present), rule in rules.items():
        assert rule.present == (op != "D") or (op, present, policy) == ("U", False, "error")
        assert rule.counted is None or not present


def test_a_policy_overrides_only_its_own_rules():
    assert step("I", True, "error").conflict and not step("I", True, "upsert").conflict
    assert step("U", False, "upsert") == Step(present=True, cells="restart")
    assert step("U", False, "error") == step("U", False, "anything else")


def test_a_single_changes_flags():
    assert single_flags(step("U", True, "error"), "010") == "020"  # not carried: the subscriber's value
    assert single_flags(step("U", False, "upsert"), "010") == "010"  # not carried: the default
    assert single_flags(step("I", True, "error"), "010") == "010"
    assert single_flags(step("D", True, "error"), None) is None  # no row, no flags


@pytest.mark.parametrize("policy", CONFLICT_POLICIES)
def test_repeated_full_updates_stay_on_the_columns(policy):
    """flows/apply/arrow_fold.py ``_last_updates`` needs the fold of repeated full UPDATEs to depend on their count alone:
    under every policy today it does (otherwise those keys would silently go through the walk, a Python step each)."""
    assert repeated_updates(True, policy) == RepeatedUpdates(True, True, 0, 0)
    upsert = policy == "upsert"
    assert repeated_updates(False, policy) == RepeatedUpdates(upsert, upsert, int(not upsert), int(not upsert))
