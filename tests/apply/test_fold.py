"""The fold's truth table, through both reducers: each key's net effect and the barriers, no database.

One table of cases, run through the reducer of the job's own process (flows/apply/net_effect.py, from Arrow
tables, change by change and, where the batch allows it, on its columns: flows/apply/arrow_fold.py) and
through Spark's (spark/apply_frames.py ``decide_frame``, from a frame of the same rows): all must stage
exactly the expected rows (subscriber/apply_stage.py ``STAGE_COLUMNS``), so a rule broken
in either fails here (docs/adr/two-reducers-one-fold.md). Each key's net effect is staged as if it
existed before the batch (``p_*``) and as if not (``a_*``); the subscriber chooses.

The in-process reducer takes a batch the publisher judged: every table passes through
(core/apply/plan.py ``PASS_THROUGH``), and a change the judge drops never reaches it, because pgoutput
never sends it (:class:`JudgedOut` marks such a change; Spark receives and drops it).

The rules are PostgreSQL's: ``apply_handle_update``/``apply_handle_delete`` in
src/backend/replication/logical/worker.c (a missing row is skipped, counted) and ``ExecInsert``'s unique
violation for a conflicting INSERT; ``pgoutput_truncate`` in src/backend/replication/pgoutput/pgoutput.c
for a TRUNCATE under ``publish_via_partition_root``.
"""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.flows.apply.arrow_fold import reduce_columns
from airflow_provider_rowfilter.flows.apply.net_effect import reduce_changes
from airflow_provider_rowfilter.flows.apply.reducers import reduce_batch
from airflow_provider_rowfilter.spark.apply_frames import decide_frame
from airflow_provider_rowfilter.subscriber.apply_stage import STAGE_COLUMNS, arrow_schema
from tests.change_rows import (
    CHANGES,
    FILTERED,
    UNFILTERED,
    arrow_rows,
    dele,
    ins,
    passed_through,
    plan,
    rules,
    trunc,
    upd,
)
from tests.dataframes import assert_dataframe_equal

#: The staged rows' columns in Spark's types, as subscriber/apply_stage.py declares them.
STAGED = ", ".join(f"{c.name} {c.spark}" for c in STAGE_COLUMNS)


class JudgedOut(tuple):
    """A change the judge drops (a filter, an unpublished operation): Spark gets it, pgoutput never sends it."""


def sent(changes: list[tuple]) -> list[tuple]:
    """What pgoutput sends of ``changes``: the ones the judge keeps."""
    return [c for c in changes if not isinstance(c, JudgedOut)]


def key_row(key: str, counts: tuple[int, int, int], vals: str | None, p: tuple, a: tuple, phase: int = 0, *,
            first: str, txn: int | None) -> tuple:
    """A staged key row; ``p``/``a``: (present, flags, conflict_lsn, conflict_xid, missing_update, missing_delete);
    ``first``: the key's first operation; ``txn``: the commit LSN of the one transaction all its changes are from."""
    return ("tok", 0, phase, "K", first, f'["{key}"]', *counts, vals, *p, *a, txn, None if txn is None else txn // 10,
            None)


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
               [key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row(), first="I", txn=100)]),
    "update": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"])], UNFILTERED,
               [key_row("1", (0, 1, 0), R2, p=row(), a=absent(missing_update=1), first="U", txn=100)]),
    "update-upsert": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"])], plan(rules(), policy="upsert"),
                      [key_row("1", (0, 1, 0), R2, p=row(), a=row(), first="U", txn=100)]),
    "update-not-carried-keeps-subscriber-value": (
        [upd(100, 0, ["1", None, "30"], unchanged=[False, True, False])], UNFILTERED,
        [key_row("1", (0, 1, 0), '["1",null,"30"]', p=row("020"), a=absent(missing_update=1), first="U", txn=100)]),
    "delete": ([dele(100, 0, ["1", "x", "20"])], UNFILTERED,
               [key_row("1", (0, 0, 1), None, p=absent(), a=absent(missing_delete=1), first="D", txn=100)]),
    "insert-update": ([ins(100, 0, ["1", "x", "20"]), upd(200, 0, ["1", "y", "30"], ["1", "x", "20"])], UNFILTERED,
                      [key_row("1", (1, 1, 0), R2, p=row(conflict=100), a=row(), first="I", txn=None)]),
    "insert-delete": ([ins(100, 0, ["1", "x", "20"]), dele(200, 0, ["1", "x", "20"])], UNFILTERED,
                      [key_row("1", (1, 0, 1), R1, p=absent(conflict=100, flags="000"), a=absent(flags="000"),
                               first="I", txn=None)]),
    "update-delete": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"]), dele(200, 0, ["1", "y", "30"])], UNFILTERED,
                      [key_row("1", (0, 1, 1), "[null,null,null]", p=absent(flags="000"),
                               a=absent(missing_update=1, missing_delete=1, flags="222"), first="U", txn=None)]),
    "delete-insert": ([dele(100, 0, ["1", "x", "20"]), ins(200, 0, ["1", "y", "30"])], UNFILTERED,
                      [key_row("1", (1, 0, 1), R2, p=row(), a=row(missing_delete=1), first="D", txn=None)]),
    # Only the first conflict is recorded (the subscriber stops there).
    "insert-delete-insert": ([ins(100, 0, ["1", "x", "20"]), dele(200, 0, ["1", "x", "20"]),
                              ins(300, 0, ["1", "y", "30"])], UNFILTERED,
                             [key_row("1", (2, 0, 1), R2, p=row(conflict=100), a=row(), first="I", txn=None)]),
    "insert-delete-insert-upsert": ([ins(100, 0, ["1", "x", "20"]), dele(200, 0, ["1", "x", "20"]),
                                          ins(300, 0, ["1", "y", "30"])], plan(rules(), policy="upsert"),
                                         [key_row("1", (2, 0, 1), R2, p=row(), a=row(), first="I", txn=None)]),
    # UPDATEs that carry every column: the last one's values (none found where the key did not exist).
    "update-update": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"]), upd(200, 0, ["1", "z", "40"])], UNFILTERED,
                      [key_row("1", (0, 2, 0), '["1","z","40"]', p=row(), a=absent(missing_update=2, flags="222"),
                                first="U", txn=None)]),
    "update-update-upsert": ([upd(100, 0, ["1", "y", "30"]), upd(200, 0, ["1", "z", "40"])],
                             plan(rules(), policy="upsert"),
                             [key_row("1", (0, 2, 0), '["1","z","40"]', p=row(), a=row(), first="U",
                                       txn=None)]),
    # Cells: a later UPDATE overwrites what it carries and keeps the rest.
    "update-update-partial": ([upd(100, 0, ["1", "y", "30"], ["1", "x", "20"]),
                               upd(200, 0, ["1", None, "40"], unchanged=[False, True, False])], UNFILTERED,
                              [key_row("1", (0, 2, 0), '["1","y","40"]', p=row(),
                                       a=absent(missing_update=2, flags="222"), first="U", txn=None)]),
    "upsert-update-update-partial": ([upd(100, 0, ["1", None, "30"], unchanged=[False, True, False]),
                                      upd(200, 0, ["1", None, "40"], unchanged=[False, True, False])],
                                     plan(rules(), policy="upsert"),
                                     [key_row("1", (0, 2, 0), '["1",null,"40"]', p=row("020"), a=row("010"),
                                              first="U", txn=None)]),
    # Dropped changes do not reach the fold: the filtered UPDATE leaves the INSERT alone.
    "filtered-changes-leave-the-fold": ([ins(100, 0, ["1", "x", "20"]), JudgedOut(upd(200, 0, ["1", "y", "5"]))], FILTERED,
                                        [key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row(), first="I", txn=100)]),
    # Barriers cut a key's changes into phases: before, the barrier, after.
    "truncate-between": ([ins(100, 0, ["1", "x", "20"]), trunc(200, 0, restart=True), ins(300, 0, ["1", "y", "30"])],
                         UNFILTERED,
                         [key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row(), first="I", txn=100),
                          barrier_row("T", None, 200, restart=True),
                          key_row("1", (1, 0, 0), R2, p=row(conflict=300), a=row(), phase=1, first="I", txn=300)]),
    "key-change-between": ([ins(100, 0, ["1", "x", "20"]),
                            upd(200, 0, ["2", "x", "20"], ["1", None, None], old_kind="K"),
                            upd(300, 0, ["2", "y", "30"])], UNFILTERED,
                           [key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row(), first="I", txn=100),
                            barrier_row("U", "1", 200, vals='["2","x","20"]', flags="000"),
                            key_row("2", (0, 1, 0), '["2","y","30"]', p=row(), a=absent(missing_update=1), phase=1,
                                    first="U", txn=300)]),
    # Under publish_via_partition_root only a TRUNCATE that emptied every leaf is sent (R8.2).
    "truncate-of-one-leaf-of-two": ([trunc(100, 0, table="t_1")],
                                    plan(rules(), leaves=(TableName("public", "t_1"), TableName("public", "t_2"))),
                                    []),
    "truncate-of-every-leaf": ([trunc(100, 0, table="t_1", lsn=150), trunc(100, 1, table="t_2", lsn=150)],
                               plan(rules(), leaves=(TableName("public", "t_1"), TableName("public", "t_2"))),
                               [barrier_row("T", None, 100, restart=False)]),
    # Changes of several keys in one batch: each key folds alone (single-change and folded keys together).
    "keys-apart": ([ins(100, 0, ["1", "x", "20"]), ins(100, 1, ["2", "x", "20"]), dele(200, 0, ["2", "x", "20"]),
                    upd(200, 1, ["3", "y", "30"], ["3", "x", "20"])], UNFILTERED,
                   [key_row("1", (1, 0, 0), R1, p=row(conflict=100), a=row(), first="I", txn=100),
                    key_row("2", (1, 0, 1), '["2","x","20"]', p=absent(conflict=100, flags="000"), a=absent(flags="000"),
                            first="I", txn=None),
                    key_row("3", (0, 1, 0), '["3","y","30"]', p=row(), a=absent(missing_update=1), first="U", txn=200)]),
}


CASES = pytest.mark.parametrize(("changes", "the_plan", "expected"), FOLD_CASES.values(), ids=FOLD_CASES.keys())


@CASES
def test_fold_in_process(changes, the_plan, expected):
    facts, rows = reduce_batch([arrow_rows(sent(changes))], passed_through(the_plan), "tok")
    assert rows.schema == arrow_schema()
    names = [c.name for c in STAGE_COLUMNS]
    assert sorted(rows.to_pylist(), key=repr) == sorted((dict(zip(names, e, strict=True)) for e in expected), key=repr)
    assert facts.changes == len(sent(changes))


#: The cases the reduction on Arrow columns leaves to the change-by-change walk (flows/apply/arrow_fold.py): a barrier,
#: an unchanged TOASTed value.
NOT_ON_COLUMNS = {"update-not-carried-keeps-subscriber-value", "update-update-partial", "upsert-update-update-partial",
                  "truncate-between", "key-change-between", "truncate-of-one-leaf-of-two", "truncate-of-every-leaf"}


@CASES
def test_fold_on_columns(request, changes, the_plan, expected):
    reduced = reduce_columns([arrow_rows(sent(changes))], passed_through(the_plan), "tok", fold_limit=10)
    if request.node.callspec.id in NOT_ON_COLUMNS:
        assert reduced is None
        return
    assert reduced is not None
    facts, rows = reduced
    assert rows.schema == arrow_schema()
    names = [c.name for c in STAGE_COLUMNS]
    assert sorted(rows.to_pylist(), key=repr) == sorted((dict(zip(names, e, strict=True)) for e in expected), key=repr)
    assert facts == reduce_changes([arrow_rows(sent(changes))], passed_through(the_plan), "tok")[0]


@CASES
def test_fold_in_spark(spark, changes, the_plan, expected):
    rows = [tuple(c) for c in changes]
    checkpointed = decide_frame(spark.createDataFrame(rows, CHANGES), the_plan)
    small = decide_frame(spark.createDataFrame(rows, CHANGES), the_plan)
    try:
        staged = checkpointed.staged("tok")
        assert_dataframe_equal(staged, spark.createDataFrame(expected, STAGED))
        # A small batch's one action (facts and staged rows together) gives the same facts and rows.
        facts, collected = small.collected("tok")
        assert facts == checkpointed.facts()
        assert collected.column_names == staged.columns
        assert sorted(map(repr, collected.to_pylist())) == sorted(repr(r.asDict()) for r in staged.collect())
    finally:  # the session is shared: no checkpointed rows left to later tests
        checkpointed.release()
        small.release()


#: A table judged change by change (subscriber/change_by_change.py): a key inserted, updated and deleted, another
#: inserted and updated, a key's move between them.
ONE_BY_ONE = [ins(100, 0, ["1", "x", "20"]), upd(200, 0, ["1", "y", "30"]), ins(300, 0, ["2", "x", "1"]),
              upd(400, 0, ["3", "x", "1"], ["2", "x", "1"]), dele(500, 0, ["1", "y", "30"]),
              upd(600, 0, ["3", "z", "2"])]


def test_judged_one_by_one_every_change_is_a_phase_in_process():
    exact = frozenset(t.index for t in UNFILTERED.targets)
    _, rows = reduce_batch([arrow_rows(ONE_BY_ONE)], passed_through(UNFILTERED), "tok", exact)
    staged = sorted(rows.to_pylist(), key=lambda r: r["phase"])
    assert [(r["phase"], r["row_kind"], r["n_insert"], r["n_update"], r["n_delete"]) for r in staged] == [
        (0, "K", 1, 0, 0), (1, "K", 0, 1, 0), (2, "K", 1, 0, 0), (3, "B", None, None, None), (4, "K", 0, 0, 1),
        (5, "K", 0, 1, 0)]
    # Not judged one by one: the net effects, cut by the key's move only.
    _, rows = reduce_batch([arrow_rows(ONE_BY_ONE)], passed_through(UNFILTERED), "tok")
    assert sorted(r["phase"] for r in rows.to_pylist()) == [0, 0, 0, 1, 1]


def test_judged_one_by_one_spark_stages_what_the_walk_stages(spark):
    exact = frozenset(t.index for t in UNFILTERED.targets)
    _, walked = reduce_batch([arrow_rows(ONE_BY_ONE)], passed_through(UNFILTERED), "tok", exact)
    decided = decide_frame(spark.createDataFrame([tuple(c) for c in ONE_BY_ONE], CHANGES), UNFILTERED)
    try:
        _, collected = decided.collected("tok", sorted(exact))
    finally:
        decided.release()
    assert sorted(map(repr, collected.to_pylist())) == sorted(map(repr, walked.to_pylist()))
