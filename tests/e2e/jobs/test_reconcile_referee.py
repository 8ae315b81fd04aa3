"""Verify and reconcile with PostgreSQL as the referee, twice, for each way a table comes to differ from a new copy.

For each case (a filter widened, narrowed, replaced by a disjoint one, a column added to the column list, a
publication added to or dropped from the subscription, rows changed on the subscriber by hand, the slot lost
and recreated), with live changes on the publisher before, during (the reconcile) and after:

- ours without reconcile equals the native subscription that lived through the change (PostgreSQL's
  behaviour), and ``verify`` reports exactly the rows a fresh native copy differs in, by key;
- ours after ``reconcile`` equals a fresh native subscription created after the change and caught up, and
  ``verify`` then reports it equal.
"""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.verify.reconcile import reconcile
from airflow_provider_rowfilter.flows.verify.verify import verify
from tests.e2e.jobs.verify_scenario import Proof, execute, expected_diff, live_changes

#: case: (publications before, after, publisher statement making the change, rows changed by hand on ours)
CASES = {
    "widened": (("p1",), ("p1",), "ALTER PUBLICATION p1 SET TABLE t WHERE (id % 2 = 0)", None),
    "narrowed": (("p1",), ("p1",), "ALTER PUBLICATION p1 SET TABLE t WHERE (id % 8 = 0)", None),
    "disjoint": (("p1",), ("p1",), "ALTER PUBLICATION p1 SET TABLE t WHERE (id % 4 = 1)", None),
    "column_added": (("p1",), ("p1",), "ALTER PUBLICATION p1 SET TABLE t WHERE (id % 4 = 0)", None),
    "publication_added": (("p1",), ("p1", "p2"), None, None),
    "publication_dropped": (("p1", "p2"), ("p1",), None, None),
    "by_hand": (("p1",), ("p1",), None, "UPDATE t SET v = 'hand' WHERE id = 8; DELETE FROM t WHERE id = 12; "
                                        "INSERT INTO t VALUES (3, 0, 'hand'), (4000000, 1, 'hand')"),
}
#: Both filtering modes for this one; the publisher's own filtering (source) for the others (an apply judging
#: in Spark is proven beside native replication by tests/e2e/jobs/test_apply_*).
BOTH_MODES = ("widened",)


@pytest.fixture
def proof(fresh_db, tmp_path, request):
    case, filtering = request.param
    if filtering == "spark":
        request.getfixturevalue("spark")  # the apply judges in the run's Spark session
    # column_added: the list starts without grp, so the rows copied before have none.
    setup = "ALTER PUBLICATION p1 SET TABLE t (id, v) WHERE (id % 4 = 0);" if case == "column_added" else None
    made = Proof(fresh_db, tmp_path, filtering, CASES[case][0], setup=setup)
    yield case, made
    made.drop()


def _params():
    for case in CASES:
        for filtering in ("source", "spark") if case in BOTH_MODES else ("source",):
            yield pytest.param((case, filtering), id=f"{case}-{filtering}")


@pytest.mark.parametrize("proof", list(_params()), indirect=True)
def test_without_reconcile_as_postgresql_then_reconciled_as_a_fresh_copy(proof):
    case, p = proof
    before, after, statement, by_hand = CASES[case]
    with live_changes(p.publisher, start=1_000_000):
        apply(p.spec)
    # The change, between two runs of live changes, once both subscriptions have everything before it: which
    # definitions judge a change still in a slot depends on when it is read (a subscription's publications are
    # the walsender's, or the capture's, when it reads; an apply judging in Spark takes them from the refresh).
    p.caught_up()
    if statement:
        execute(p.publisher, statement)
    if after != before:
        p.respec(after)
        added, dropped = set(after) - set(before), set(before) - set(after)
        for name in added:
            execute(p.lived.subscriber, f"ALTER SUBSCRIPTION {p.lived.name} ADD PUBLICATION {name}")
        for name in dropped:
            execute(p.lived.subscriber, f"ALTER SUBSCRIPTION {p.lived.name} DROP PUBLICATION {name}")
    refreshed = refresh(p.spec)
    if statement or after != before:
        assert list(refreshed.copy_definitions_changed) == ["public.t"], refreshed
    with live_changes(p.publisher, start=2_000_000):
        apply(p.spec)
    if by_hand:
        execute(p.ours, by_hand)
    p.caught_up()

    ours = p.rows(p.ours)
    if not by_hand:  # PostgreSQL's behaviour: what the native subscription that lived through it holds
        assert ours == p.rows(p.lived.subscriber)
    fresh = p.fresh(after)
    p.caught_up()
    expected = expected_diff(ours, p.rows(p.fresh_dsn))
    assert expected != (0, 0, 0)
    (check,) = verify(p.spec).tables
    assert (check.missing, check.extra, check.different) == expected, check

    with live_changes(p.publisher, start=3_000_000):
        (done,) = reconcile(p.spec).tables
    assert done.inserted + done.updated + done.deleted > 0, done
    with live_changes(p.publisher, start=4_000_000):
        apply(p.spec)
    p.caught_up()
    assert p.rows(p.ours) == p.rows(fresh.subscriber)
    (check,) = verify(p.spec).tables
    assert check.clean, check


def test_a_lost_slot_is_repaired_in_place(fresh_db, tmp_path):
    p = Proof(fresh_db, tmp_path, "source")
    try:
        with live_changes(p.publisher, start=1_000_000):
            apply(p.spec)
        # The slot is dropped; changes made meanwhile never reach it.
        execute(p.publisher, f"SELECT pg_drop_replication_slot('rowfilter_{p.spec.subscription}')")
        with live_changes(p.publisher, start=2_000_000):
            pass
        with live_changes(p.publisher, start=3_000_000):
            repaired = refresh(p.spec, recreate_slot=True, reconcile=True)
        assert repaired.slot_created and not repaired.resynced
        (done,) = repaired.reconciled
        assert done["table"] == "public.t" and done["inserted"] + done["updated"] + done["deleted"] > 0
        with live_changes(p.publisher, start=4_000_000):
            apply(p.spec)
        p.caught_up()
        assert p.rows(p.ours) == p.rows(p.lived.subscriber)
        assert verify(p.spec).clean
    finally:
        p.drop()
