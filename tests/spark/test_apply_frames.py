"""The apply's judge and fold on small inline frames (spark/apply_frames.py, docs/apply.md).

Each case builds a few change-log rows by hand, judges them with :func:`decide_frame` for a plan
written in the test, and compares a whole frame with the expected one: the judged changes (what
each is applied as, the key it is found by, its values and flags, whether it is a barrier), or the
staged rows (each key's net effect as if it existed before the batch, ``p_*``, and as if not,
``a_*``; the barriers). No database: the staging write is the only step that needs one.

The rules are PostgreSQL's: ``pgoutput_change`` and ``pgoutput_row_filter`` in
src/backend/replication/pgoutput/pgoutput.c (publish per action, filter on the new or old row,
UPDATE → INSERT/DELETE); ``apply_handle_update``/``apply_handle_delete`` in
src/backend/replication/logical/worker.c (a missing row is skipped, counted) and
``ExecInsert``'s unique violation for a conflicting INSERT.
"""

from __future__ import annotations

import pytest
import sqlglot

from airflow_provider_rowfilter.core.apply_plan import ApplyPlan, EpochRules, TargetPlan
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.spark.apply_frames import decide_frame
from airflow_provider_rowfilter.spark.settings import SMALL_BATCH_SQL_SETTINGS
from tests.dataframes import assert_dataframe_equal

# The change log's columns that the judge reads (change_log/log.py SCHEMA), in Spark's types.
CHANGES = ("commit_lsn bigint, seq int, lsn bigint, xid bigint, kind string, schema string, `table` string, "
           "column_names array<string>, new_values array<string>, new_unchanged array<boolean>, old_kind string, "
           "old_values array<string>, truncate_restart_identity boolean")
JUDGED = "seq int, _op string, _key array<string>, _vals array<string>, _fl string, _barrier boolean"
JUDGED_COLUMNS = [c.split()[0] for c in JUDGED.split(", ")]
STAGED = ("token string, target int, phase int, row_kind string, op string, key string, n_insert bigint, "
          "n_update bigint, n_delete bigint, vals string, "
          "p_present boolean, p_flags string, p_conflict_lsn bigint, p_conflict_xid bigint, p_missing_update bigint, "
          "p_missing_delete bigint, a_present boolean, a_flags string, a_conflict_lsn bigint, a_conflict_xid bigint, "
          "a_missing_update bigint, a_missing_delete bigint, commit_lsn bigint, xid bigint, restart_identity boolean")

T = TableName("public", "t")
COLUMNS = ("id", "a", "n")
ALL = frozenset({"insert", "update", "delete", "truncate"})


def rules(actions=ALL, filter_: str | None = None, columns=None) -> EpochRules:
    """One epoch's rules for ``t``: the same filter (Spark SQL on ``n integer``) for every DML action."""
    tree = None if filter_ is None else sqlglot.parse_one(filter_, dialect="spark")
    return EpochRules(actions=frozenset(actions),
                      filters={a: tree for a in ("insert", "update", "delete") if a in actions},
                      columns=columns, column_types={"n": "integer"} if filter_ else {})


def plan(*epoch_rules: EpochRules | None, epochs: tuple[int, ...] = (), position: int = 0,
         skip_lsn: int | None = None, policy: str = "error", leaves=(T,)) -> ApplyPlan:
    return ApplyPlan(epochs, (TargetPlan(0, T, tuple(leaves), position, COLUMNS, ("id",), epoch_rules),),
                     skip_lsn, policy)


FILTERED = plan(rules(filter_="n > 10"))
UNFILTERED = plan(rules())


# Change-log rows. Each transaction's commit LSN is also its xid's tenfold, so a row reads easily.
def ins(commit: int, seq: int, new: list, *, table: str = "t", names=COLUMNS, unchanged=None) -> tuple:
    return (commit, seq, commit + seq, commit // 10, "insert", "public", table, list(names), new,
            unchanged or [False] * len(names), None, None, None)


def upd(commit: int, seq: int, new: list, old: list | None = None, *, old_kind: str | None = "O",
        unchanged=None, names=COLUMNS) -> tuple:
    return (commit, seq, commit + seq, commit // 10, "update", "public", "t", list(names), new,
            unchanged or [False] * len(names), old_kind if old is not None else None, old, None)


def dele(commit: int, seq: int, old: list, *, old_kind: str = "O") -> tuple:
    return (commit, seq, commit + seq, commit // 10, "delete", "public", "t", list(COLUMNS), None, None,
            old_kind, old, None)


def trunc(commit: int, seq: int, *, table: str = "t", restart: bool = False, lsn: int | None = None) -> tuple:
    """A TRUNCATE row; one statement's rows (one per leaf) share its message's ``lsn``."""
    return (commit, seq, commit + seq if lsn is None else lsn, commit // 10, "truncate", "public", table, list(COLUMNS),
            None, None,
            None, None, restart)


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
    # UPDATE with an old row: the decision table of core/update_decision.py.
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


# ---- the fold: each key's net effect, as if it existed before the batch (p) and as if not (a) --------------

def key_row(key: str, counts: tuple[int, int, int], vals: str | None, p: tuple, a: tuple, phase: int = 0) -> tuple:
    """A staged key row; ``p``/``a``: (present, flags, conflict_lsn, conflict_xid, missing_update, missing_delete)."""
    return ("tok", 0, phase, "K", None, f'["{key}"]', *counts, vals, *p, *a, None, None, None)


def barrier_row(op: str, key: str | None, commit: int, vals: str | None = None, flags: str | None = None,
                restart: bool | None = None, phase: int = 0) -> tuple:
    return ("tok", 0, phase, "B", op, None if key is None else f'["{key}"]', None, None, None, vals,
            None, flags, *[None] * 10, commit, commit // 10, restart)


def absent(missing_update: int = 0, missing_delete: int = 0, conflict: int | None = None,
           flags: str | None = None) -> tuple:
    """An outcome that leaves no row; a fold still reports its last cells' flags (the subscriber reads none)."""
    return (False, flags, conflict, None if conflict is None else conflict // 10, missing_update, missing_delete)


def row(flags: str = "000", conflict: int | None = None, missing_update: int = 0, missing_delete: int = 0) -> tuple:
    return (True, flags, conflict, None if conflict is None else conflict // 10, missing_update, missing_delete)


R1 = '["1","x","20"]'
R2 = '["1","y","30"]'

# (changes, plan, expected staged rows). A single change's flags: UPDATE turns "not carried" into the
# subscriber's value (2) where the row exists; a fold starts from the subscriber's values (2).
FOLD_CASES = {
    "insert": ([ins(100, 0, ["1", "x", "20"])], UNFILTERED,
               [key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row())]),
    "update": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"])], UNFILTERED,
               [key_row("1", (0, 1, 0), R2, p=row(), a=absent(missing_update=1))]),
    "update-upsert": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"])], plan(rules(), policy="upsert"),
                      [key_row("1", (0, 1, 0), R2, p=row(), a=row())]),
    "update-not-carried-keeps-subscriber-value": (
        [upd(100, 0, ["1", None, "30"], unchanged=[False, True, False])], UNFILTERED,
        [key_row("1", (0, 1, 0), '["1",null,"30"]', p=row("020"), a=absent(missing_update=1))]),
    "delete": ([dele(100, 0, ["1", "x", "20"])], UNFILTERED,
               [key_row("1", (0, 0, 1), None, p=absent(), a=absent(missing_delete=1))]),
    "insert-update": ([ins(100, 0, ["1", "x", "20"]), upd(200, 0, ["1", "y", "30"], ["1", "x", "20"])], UNFILTERED,
                      [key_row("1", (1, 1, 0), R2, p=row(conflict=100), a=row())]),
    "insert-delete": ([ins(100, 0, ["1", "x", "20"]), dele(200, 0, ["1", "x", "20"])], UNFILTERED,
                      [key_row("1", (1, 0, 1), R1, p=absent(conflict=100, flags="000"), a=absent(flags="000"))]),
    "update-delete": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"]), dele(200, 0, ["1", "y", "30"])], UNFILTERED,
                      [key_row("1", (0, 1, 1), "[null,null,null]", p=absent(flags="000"),
                               a=absent(missing_update=1, missing_delete=1, flags="222"))]),
    "delete-insert": ([dele(100, 0, ["1", "x", "20"]), ins(200, 0, ["1", "y", "30"])], UNFILTERED,
                      [key_row("1", (1, 0, 1), R2, p=row(), a=row(missing_delete=1))]),
    # Only the first conflict is recorded (the subscriber stops there).
    "insert-delete-insert": ([ins(100, 0, ["1", "x", "20"]), dele(200, 0, ["1", "x", "20"]),
                              ins(300, 0, ["1", "y", "30"])], UNFILTERED,
                             [key_row("1", (2, 0, 1), R2, p=row(conflict=100), a=row())]),
    "insert-delete-insert-upsert": ([ins(100, 0, ["1", "x", "20"]), dele(200, 0, ["1", "x", "20"]),
                                          ins(300, 0, ["1", "y", "30"])], plan(rules(), policy="upsert"),
                                         [key_row("1", (2, 0, 1), R2, p=row(), a=row())]),
    # Cells: a later UPDATE overwrites what it carries and keeps the rest.
    "update-update-partial": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"]),
                               upd(200, 0, ["1", None, "40"], unchanged=[False, True, False])], UNFILTERED,
                              [key_row("1", (0, 2, 0), '["1","y","40"]', p=row(),
                                       a=absent(missing_update=2, flags="222"))]),
    "upsert-update-update-partial": ([upd(100, 0, ["1", None, "30"], unchanged=[False, True, False]),
                                      upd(200, 0, ["1", None, "40"], unchanged=[False, True, False])],
                                     plan(rules(), policy="upsert"),
                                     [key_row("1", (0, 2, 0), '["1",null,"40"]', p=row("020"), a=row("010"))]),
    # Dropped changes do not reach the fold: the filtered UPDATE leaves the INSERT alone.
    "filtered-changes-leave-the-fold": ([ins(100, 0, ["1", "x", "20"]), upd(200, 0, ["1", "y", "5"])], FILTERED,
                                        [key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row())]),
    # Barriers cut a key's changes into phases: before, the barrier, after.
    "truncate-between": ([ins(100, 0, ["1", "x", "20"]), trunc(200, 0, restart=True), ins(300, 0, ["1", "y", "30"])],
                         UNFILTERED,
                         [key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row()),
                          barrier_row("T", None, 200, restart=True),
                          key_row("1", (1, 0, 0), R2, p=row(conflict=300), a=row(), phase=1)]),
    "key-change-between": ([ins(100, 0, ["1", "x", "20"]),
                            upd(200, 0, ["2", "x", "20"], ["1", None, None], old_kind="K"),
                            upd(300, 0, ["2", "y", "30"])], UNFILTERED,
                           [key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row()),
                            barrier_row("U", "1", 200, vals='["2","x","20"]', flags="000"),
                            key_row("2", (0, 1, 0), '["2","y","30"]', p=row(), a=absent(missing_update=1), phase=1)]),
    # Under publish_via_partition_root only a TRUNCATE that emptied every leaf is sent (R8.2).
    "truncate-of-one-leaf-of-two": ([trunc(100, 0, table="t_1")],
                                    plan(rules(), leaves=(TableName("public", "t_1"), TableName("public", "t_2"))),
                                    []),
    "truncate-of-every-leaf": ([trunc(100, 0, table="t_1", lsn=150), trunc(100, 1, table="t_2", lsn=150)],
                               plan(rules(), leaves=(TableName("public", "t_1"), TableName("public", "t_2"))),
                               [barrier_row("T", None, 100, restart=False)]),
}


@pytest.mark.parametrize(("changes", "the_plan", "expected"), FOLD_CASES.values(), ids=FOLD_CASES.keys())
def test_fold(spark, changes, the_plan, expected):
    checkpointed = decide_frame(spark.createDataFrame(changes, CHANGES), the_plan)
    staged = checkpointed.staged("tok")
    assert_dataframe_equal(staged, spark.createDataFrame(expected, STAGED))
    # A small batch's one action (facts and staged rows together) gives the same facts and rows.
    facts, rows = decide_frame(spark.createDataFrame(changes, CHANGES), the_plan).collected("tok")
    assert facts == checkpointed.facts()
    assert rows.column_names == staged.columns
    assert sorted(map(repr, rows.to_pylist())) == sorted(repr(r.asDict()) for r in staged.collect())


def test_fold_keeps_keys_apart(spark):
    """Changes of several keys in one batch: each key folds alone (single-change and folded keys together)."""
    changes = [ins(100, 0, ["1", "x", "20"]), ins(100, 1, ["2", "x", "20"]), dele(200, 0, ["2", "x", "20"]),
               upd(200, 1, ["3", "y", "30"], ["3", "x", "20"])]
    staged = decide_frame(spark.createDataFrame(changes, CHANGES), UNFILTERED).staged("tok")
    assert_dataframe_equal(staged, spark.createDataFrame([
        key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row()),
        key_row("2", (1, 0, 1), '["2","x","20"]', p=absent(conflict=100, flags="000"), a=absent(flags="000")),
        key_row("3", (0, 1, 0), '["3","y","30"]', p=row(), a=absent(missing_update=1)),
    ], STAGED))


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
