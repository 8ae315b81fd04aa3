"""Change-log rows written by hand, and the plans that judge them: what the reducers' tests are written in.

Shared by the judge's tests (tests/spark/test_apply_frames.py) and the fold's truth table, which runs
through both reducers (tests/apply/test_fold.py). A row is a tuple of :data:`CHANGE_FIELDS` (the change
log's columns the reducers read, change_log/segment_schema.py ``SCHEMA``); :func:`arrow_rows` makes a segment of
them for the in-process reducer, ``spark.createDataFrame(rows, CHANGES)`` a frame for Spark's.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import sqlglot

from airflow_provider_rowfilter.core.apply.plan import PASS_THROUGH, ApplyPlan, EpochRules, TargetPlan
from airflow_provider_rowfilter.core.relation import TableName

#: The change log's columns that the judge reads, in Spark's types (a row's fields, in this order).
CHANGES = ("commit_lsn bigint, seq int, lsn bigint, xid bigint, kind string, schema string, `table` string, "
           "column_names array<string>, new_values array<string>, new_unchanged array<boolean>, old_kind string, "
           "old_values array<string>, truncate_restart_identity boolean")
CHANGE_FIELDS = pa.schema([
    ("commit_lsn", pa.int64()), ("seq", pa.int32()), ("lsn", pa.int64()), ("xid", pa.int64()), ("kind", pa.string()),
    ("schema", pa.string()), ("table", pa.string()), ("column_names", pa.list_(pa.string())),
    ("new_values", pa.list_(pa.string())), ("new_unchanged", pa.list_(pa.bool_())), ("old_kind", pa.string()),
    ("old_values", pa.list_(pa.string())), ("truncate_restart_identity", pa.bool_()),
])

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


def passed_through(judged: ApplyPlan) -> ApplyPlan:
    """``judged`` as a batch the publisher judged takes it: every table :data:`PASS_THROUGH`, one epoch."""
    return ApplyPlan((0,), tuple(TargetPlan(t.index, t.table, t.leaves, t.position, t.columns, t.key, (PASS_THROUGH,))
                                 for t in judged.targets), judged.skip_lsn, judged.policy)


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


def arrow_rows(rows: Sequence[tuple], replica_identity: str = "d") -> pa.Table:
    """``rows`` as one change-log segment, with the columns the in-process reducer reads."""
    columns = {f.name: [r[i] for r in rows] for i, f in enumerate(CHANGE_FIELDS)}
    table = pa.Table.from_pydict(columns, schema=CHANGE_FIELDS)
    return table.append_column("replica_identity", pa.array([replica_identity] * len(rows), pa.string()))
