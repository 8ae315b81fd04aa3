"""The apply's judge on small inline frames (spark/apply_frames.py, docs/apply.md).

Each case builds a few change-log rows by hand (tests/change_rows.py), judges them with
:func:`decide_frame` for a plan written in the test, and compares the judged changes as a whole frame
with the expected one: what each is applied as, the key it is found by, its values and flags, whether
it is a barrier. No database. The fold that follows the judge has its truth table in
tests/apply/test_fold.py, run through Spark's reducer and the in-process one.

The rules are PostgreSQL's: ``pgoutput_change`` and ``pgoutput_row_filter`` in
src/backend/replication/pgoutput/pgoutput.c (publish per action, filter on the new or old row,
UPDATE → INSERT/DELETE).
"""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.apply.plan import ApplyPlan
from airflow_provider_rowfilter.spark.apply_frames import decide_frame
from airflow_provider_rowfilter.spark.settings import SMALL_BATCH_SQL_SETTINGS
from tests.change_rows import CHANGES, COLUMNS, FILTERED, UNFILTERED, dele, ins, plan, rules, trunc, upd
from tests.dataframes import assert_dataframe_equal

JUDGED = "seq int, _op string, _key array<string>, _vals array<string>, _fl string, _barrier boolean"
JUDGED_COLUMNS = [c.split()[0] for c in JUDGED.split(", ")]


def judged(spark, changes: list[tuple], the_plan: ApplyPlan):
    return decide_frame(spark.createDataFrame(changes, CHANGES), the_plan).frame.select(*JUDGED_COLUMNS)


# ---- the judge -------------------------------------------------------------------------------------------

# (changes, plan, expected judged rows: seq, _op, _key, _vals, _fl, _barrier)
JUDGE_CASES = {
    # INSERT: the filter on the new row; NULL is no match (pgoutput_row_filter_exec_expr).
    "insert-match": ([ins(100, 0, ["1", "x", "20"])], FILTERED,
                     [(0, "I", ["1"], ["1", "x", "20"], "000", False)]),
    "insert-no-match": ([ins(100, 0, ["1", "x", "5"])], FILTERED, [(0, "x", None, None, None, False)]),
    "insert-null-is-no-match": ([ins(100, 0, ["1", "x", None])], FILTERED, [(0, "x", None, None, None, False)]),
    # DELETE: the filter on the old row; found by the old key.
    "delete-match": ([dele(100, 0, ["1", "x", "20"])], FILTERED, [(0, "D", ["1"], None, None, False)]),
    "delete-no-match": ([dele(100, 0, ["1", "x", "5"])], FILTERED, [(0, "x", None, None, None, False)]),
    # UPDATE with an old row: the decision table of core/apply/update_decision.py.
    "update-both-match": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"])], FILTERED,
                          [(0, "U", ["1"], ["1", "y", "30"], "000", False)]),
    "update-new-only-is-insert": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "5"])], FILTERED,
                                  [(0, "I", ["1"], ["1", "y", "30"], "000", False)]),
    "update-old-only-is-delete": ([upd(100, 0, ["1", "y", "5"], ["1", "x", "20"])], FILTERED,
                                  [(0, "D", ["1"], None, None, False)]),
    "update-neither-is-dropped": ([upd(100, 0, ["1", "y", "5"], ["1", "x", "6"])], FILTERED,
                                  [(0, "x", None, None, None, False)]),
    # UPDATE without an old row (key unchanged, identity DEFAULT): the new row alone, never transformed.
    "update-no-old-row-match": ([upd(100, 0, ["1", "y", "30"])], FILTERED,
                                [(0, "U", ["1"], ["1", "y", "30"], "000", False)]),
    "update-no-old-row-no-match": ([upd(100, 0, ["1", "y", "5"])], FILTERED, [(0, "x", None, None, None, False)]),
    # An UPDATE that changes the key (old key sent) is a barrier, found by its old key.
    "update-key-change-is-barrier": ([upd(100, 0, ["2", "y", "30"], ["1", None, None], old_kind="K")], UNFILTERED,
                                     [(0, "U", ["1"], ["2", "y", "30"], "000", True)]),
    # Unpublished actions are dropped ('u'), filters or not.
    "unpublished-delete": ([ins(100, 0, ["1", "x", "20"]), dele(100, 1, ["1", "x", "20"])],
                           plan(rules(actions={"insert", "update"}, filter_="n > 10")),
                           [(0, "I", ["1"], ["1", "x", "20"], "000", False), (1, "u", None, None, None, False)]),
    "unpublished-insert-and-update": ([ins(100, 0, ["1", "x", "20"]), upd(100, 1, ["1", "y", "30"], ["1", "x", "20"])],
                                      plan(rules(actions={"delete"})),
                                      [(0, "u", None, None, None, False), (1, "u", None, None, None, False)]),
    # TRUNCATE ignores filters (R8); unpublished, it is dropped.
    "truncate-ignores-filter": ([trunc(100, 0, restart=True)], FILTERED, [(0, "T", None, None, None, False)]),
    "truncate-unpublished": ([trunc(100, 0)], plan(rules(actions={"insert", "update", "delete"})),
                             [(0, "u", None, None, None, False)]),
    # Column list (a, n not listed: flag 1); a column the publisher lacks is not carried either.
    "column-list": ([ins(100, 0, ["1", "x", "20"])], plan(rules(columns=("id", "n"))),
                    [(0, "I", ["1"], ["1", "x", "20"], "010", False)]),
    "column-the-publisher-lacks": ([ins(100, 0, ["1", "20"], names=("id", "n"))], UNFILTERED,
                                   [(0, "I", ["1"], ["1", None, "20"], "010", False)]),
    # An unchanged TOASTed value: from the old full row when there is one (R5.5), else not carried.
    "unchanged-toast-from-old-row": ([upd(100, 0, ["1", None, "30"], ["1", "big", "20"], unchanged=[False, True, False])],
                                     UNFILTERED, [(0, "U", ["1"], ["1", "big", "30"], "000", False)]),
    "unchanged-toast-not-carried": ([upd(100, 0, ["1", None, "30"], unchanged=[False, True, False])], UNFILTERED,
                                    [(0, "U", ["1"], ["1", None, "30"], "010", False)]),
    # ALTER SUBSCRIPTION … SKIP: the whole transaction ('s'), whatever the filters say.
    "skip-lsn": ([ins(100, 0, ["1", "x", "20"]), ins(100, 1, ["2", "x", "5"]), ins(200, 0, ["3", "x", "20"])],
                 plan(rules(filter_="n > 10"), skip_lsn=100),
                 [(0, "s", None, None, None, False), (1, "s", None, None, None, False),
                  (0, "I", ["3"], ["3", "x", "20"], "000", False)]),
    # Changes before the table's position are not the batch's; other tables are not routed.
    "position-and-routing": ([ins(100, 0, ["1", "x", "20"]), ins(200, 0, ["2", "x", "20"]),
                              ins(200, 1, ["3", "x", "20"], table="other")],
                             plan(rules(), position=200), [(0, "I", ["2"], ["2", "x", "20"], "000", False)]),
    # Epochs: a change is judged by the definitions in force at its commit LSN (R2.9).
    "epochs": ([ins(100, 0, ["1", "x", "20"]), ins(200, 0, ["2", "x", "20"]), ins(300, 0, ["3", "x", "5"])],
               plan(rules(filter_="n > 10"), None, rules(filter_="n < 10"), epochs=(0, 200, 300)),
               [(0, "I", ["1"], ["1", "x", "20"], "000", False), (0, "u", None, None, None, False),
                (0, "I", ["3"], ["3", "x", "5"], "000", False)]),
}


@pytest.mark.parametrize(("changes", "the_plan", "expected"), JUDGE_CASES.values(), ids=JUDGE_CASES.keys())
def test_judge(spark, changes, the_plan, expected):
    assert_dataframe_equal(judged(spark, changes, the_plan), spark.createDataFrame(expected, JUDGED))


def test_not_subscribed_in_an_epoch_drops_nothing_silently(spark):
    """A table not in an epoch's definitions: its changes of that epoch are neither applied nor kept."""
    the_plan = plan(rules(), None, epochs=(0, 200))
    assert_dataframe_equal(judged(spark, [ins(100, 0, ["1", "x", "20"]), ins(200, 0, ["2", "x", "20"])], the_plan),
                           spark.createDataFrame([(0, "I", ["1"], ["1", "x", "20"], "000", False),
                                                  (0, "u", None, None, None, False)], JUDGED))


def test_facts_count_what_the_judge_dropped_and_transformed(spark):
    changes = [ins(100, 0, ["1", "x", "5"]), upd(100, 1, ["1", "y", "30"], ["1", "x", "5"]),
               upd(100, 2, ["1", "y", "5"], ["1", "x", "30"]), trunc(200, 0)]
    facts = decide_frame(spark.createDataFrame(changes, CHANGES), FILTERED).facts()
    assert facts.counts == {0: {"filtered": 1, "update_to_insert": 1, "update_to_delete": 1}}
    assert (facts.barrier_targets, facts.changes, facts.skipped) == ([0], 4, False)
    assert facts.column_sets == [(0, COLUMNS, 100)]


def test_small_batch_action_leaves_the_sessions_settings_as_they_were(spark):
    """The one action of a small batch runs without AQE over one shuffle partition, and puts back the
    session's own settings after it: the job's session is reused by the next batch (and, through
    Spark Connect, by the next run), which may be a large one."""
    changes = [ins(100, 0, ["1", "x", "20"]), upd(200, 1, ["1", "y", "30"], ["1", "x", "20"])]
    before = {key: spark.conf.get(key) for key in SMALL_BATCH_SQL_SETTINGS}
    spark.conf.set("spark.sql.shuffle.partitions", "7")
    try:
        facts, rows = decide_frame(spark.createDataFrame(changes, CHANGES), UNFILTERED).collected("tok")
        assert rows.num_rows == 1 and facts.changes == 2
        assert spark.conf.get("spark.sql.shuffle.partitions") == "7"
        assert spark.conf.get("spark.sql.adaptive.enabled") == before["spark.sql.adaptive.enabled"]
    finally:
        for key, value in before.items():
            spark.conf.set(key, value)
