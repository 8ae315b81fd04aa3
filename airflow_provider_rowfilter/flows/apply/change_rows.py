"""The rows both in-process reducers share: a batch's changes as routed to their tables, and the stage's rows.

flows/apply/net_effect.py (change by change) and flows/apply/arrow_fold.py (on the Arrow columns) read the
same change-log columns (:data:`CHANGE_COLUMNS`), place a table's columns in each relation layout of the log
the same way (:class:`Layout`, ``judged_frame`` steps 1 and 2 of spark/judge.py), and stage the same rows of
``rowfilter.apply_stage`` (:class:`Stage`, spark/apply_frames.py ``staged``), a key changed more than once folded
by core/apply/fold_rules.py's rules (``_folded``, spark/fold_expressions.py ``folded``). Which reducer runs is
flows/apply/reducers.py's choice.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_rowfilter.core.apply.fold_rules import OPERATIONS, Step, single_flags, steps
from airflow_provider_rowfilter.core.apply.plan import TargetPlan
from airflow_provider_rowfilter.subscriber.apply_stage import OUTCOME_FIELDS, arrow_schema

#: The change log's columns the reduction reads (change_log/segment_schema.py ``SCHEMA``).
CHANGE_COLUMNS = ("commit_lsn", "seq", "lsn", "xid", "kind", "schema", "table", "replica_identity", "column_names",
                  "new_values", "new_unchanged", "old_kind", "old_values", "truncate_restart_identity")
# Read per row; the columns' names and the TOASTed flags are read per layout and for the rows that have one.
ROW_COLUMNS = ("commit_lsn", "seq", "lsn", "xid", "kind", "schema", "table", "replica_identity", "new_values", "old_kind",
        "old_values", "truncate_restart_identity")


@dataclass(slots=True)
class Change:
    """One change routed to its table, as ``judged_frame`` (spark/judge.py) leaves it for the stage."""

    commit_lsn: int
    seq: int
    xid: int
    op: str  # I U D; T; n: an UPDATE or DELETE of a table without a key, not REPLICA IDENTITY FULL
    key: list[str | None] | None
    vals: list[str | None] | None
    flags: str | None
    barrier: bool
    restart_identity: bool | None = None


ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def json_array(values: Sequence[str | None] | None) -> str | None:
    """Spark's ``to_json`` of an array of strings (the subscriber reads it as jsonb)."""
    return None if values is None else ENCODE(values)


def layout_ids(column_names: pa.ChunkedArray) -> tuple[list[int], list[tuple[str, ...]]]:
    """Each row's layout (its relation's column names) as a number, and the layouts: the names repeat the
    relation's on every row, so they are joined and told apart by Arrow rather than listed per row."""
    joined = pc.binary_join(column_names, "\x00").combine_chunks().dictionary_encode()  # no NUL in a name
    # "" is a relation without columns (CREATE TABLE t ()): no name at all, not one empty name
    return joined.indices.to_pylist(), [tuple(s.split("\x00")) if s else () for s in joined.dictionary.to_pylist()]


class Layout:
    """Where a table's columns sit in one relation layout of the log (``judged_frame`` steps 1 and 2)."""

    def __init__(self, target: TargetPlan, names: Sequence[str]) -> None:
        at = {name: i for i, name in reversed(list(enumerate(names)))}  # the first, as array_position
        self.target, self.names, self.width = target, tuple(names), len(names)
        self.columns = [at.get(c) for c in target.columns]
        self.key = [at.get(k) for k in target.key]
        self.complete = None not in self.columns and None not in self.key
        # the same positions, typed as what they are when the layout has every column and key column
        self.columns_at = [p for p in self.columns if p is not None] if self.complete else None
        self.key_at = [p for p in self.key if p is not None] if self.complete else None
        self.same_order = self.complete and self.columns == list(range(len(names)))  # the values as they are
        # 1: a column the change does not carry (an INSERT fills it with its default: worker.c slot_fill_defaults)
        self.flags = "".join("1" if p is None else "0" for p in self.columns)

    def _read(self, positions: list[int | None], exact: list[int] | None, values: list | None) -> list[str | None]:
        """The values at ``positions`` (``exact``: the same, when the layout is complete)."""
        if values is None:
            return [None] * len(positions)
        if exact is not None and len(values) == self.width:
            return [values[p] for p in exact]
        return [None if p is None else _at(values, p) for p in positions]

    def change(self, op: str, commit_lsn: int, seq: int, xid: int, identity: str, new: list | None,
               unchanged: list | None, old_kind: str | None, old: list | None) -> Change:
        full = old_kind == "O"
        toasted = new is not None and unchanged is not None and True in unchanged
        if toasted and full and new is not None and unchanged is not None:
            # an unchanged TOASTed value, taken from the old full row (pgoutput_row_filter)
            new = [_at(old, p) if u else v for p, (v, u) in enumerate(zip(new, unchanged, strict=False))]
        keyed = bool(self.target.key)
        if keyed:
            new_key = self._read(self.key, self.key_at, new)
            old_key = self._read(self.key, self.key_at, old) if op != "I" else None
        else:  # a change to a table without a key is its own key
            new_key = old_key = [str(commit_lsn), str(seq)]
        found_by = new_key if op == "I" or (op == "U" and old is None) else old_key if op in ("U", "D") else None
        barrier = op == "U" and old is not None and old_key != new_key
        if not keyed and op in ("U", "D"):
            # worker.c check_relation_updatable: found by the old row on every column, one statement each
            op = op if identity == "f" else "n"
            found_by = self._read(self.columns, self.columns_at, old)
            barrier = True
        if op not in ("I", "U"):
            return Change(commit_lsn, seq, xid, op, found_by, None, None, barrier)
        flags = self.flags
        if toasted and not full and op == "U":
            # without the old full row, an unchanged TOASTed value is not sent: the subscriber keeps its own
            # (worker.c slot_modify_data)
            flags = "".join("1" if p is None or _at(unchanged, p) else "0" for p in self.columns)
        vals = new if self.same_order and new is not None and len(new) == self.width \
            else self._read(self.columns, self.columns_at, new)
        return Change(commit_lsn, seq, xid, op, found_by, vals, flags, barrier)


def _at(values: list | None, p: int) -> str | None:
    return values[p] if values is not None and p < len(values) else None


_K_COLUMNS = ("target", "phase", "key", "n_insert", "n_update", "n_delete", "vals",
              *(f"{side}_{name}" for side in ("p", "a") for name in OUTCOME_FIELDS), "op", "commit_lsn", "xid")
_B_COLUMNS = ("target", "phase", "op", "key", "commit_lsn", "xid", "restart_identity", "vals", "p_flags")


class Stage:
    """The rows of ``rowfilter.apply_stage`` (``DecidedBatch.staged``): keys ('K') and barriers ('B')."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.keys: list[tuple] = []
        self.barriers: list[tuple] = []

    def table(self) -> pa.Table:
        k, b = len(self.keys), len(self.barriers)
        by_kind = {"K": dict(zip(_K_COLUMNS, zip(*self.keys, strict=True) if k else repeat((), len(_K_COLUMNS)),
                                 strict=True)),
                   "B": dict(zip(_B_COLUMNS, zip(*self.barriers, strict=True) if b else repeat((), len(_B_COLUMNS)),
                                 strict=True))}
        arrays = []
        schema = arrow_schema()
        for f in schema:
            if f.name == "token":
                values: list = [self.token] * (k + b)
            elif f.name == "row_kind":
                values = ["K"] * k + ["B"] * b
            else:
                values = [*by_kind["K"].get(f.name, repeat(None, k)), *by_kind["B"].get(f.name, repeat(None, b))]
            arrays.append(pa.array(values, f.type))
        return pa.Table.from_arrays(arrays, schema=schema)

    def add(self, target: TargetPlan, kept: list[Change], policy: str, *, exact: bool = False) -> None:
        """Cut the table's changes into phases by its barriers, stage each barrier, reduce each phase's keys
        (``exact``: every change a phase of its own, so the subscriber applies them one by one, as PostgreSQL)."""
        kept.sort(key=attrgetter("commit_lsn", "seq"))
        keys: dict[tuple[int, tuple], list[Change]] = {}
        phase = 0
        for change in kept:
            if change.barrier:
                # in a single UPDATE a column it does not carry keeps the subscriber's value (flag 2)
                self.barriers.append((target.index, phase, change.op, json_array(change.key), change.commit_lsn,
                                      change.xid, change.restart_identity, json_array(change.vals),
                                      None if change.flags is None else change.flags.replace("1", "2")))
                phase += 1
            else:
                keys.setdefault((phase, tuple(change.key or ())), []).append(change)  # a key is never None here
                phase += exact
        width = len(target.columns)
        rules = steps(policy)
        singles, table = _single_rules(rules), _fold_table(rules)
        for (at, key), ops in keys.items():
            if len(ops) == 1:
                o = ops[0]
                found, missed = singles[o.op]
                present, absent = _single(o, *found), _single(o, *missed)
                vals = o.vals if o.op != "D" else absent[0]
                n = (1, 0, 0) if o.op == "I" else (0, 1, 0) if o.op == "U" else (0, 0, 1)
            else:
                present, absent = _folded(ops, True, table, width), _folded(ops, False, table, width)
                vals = present[0] if present[1] else absent[0]
                counted = Counter(c.op for c in ops)
                n = (counted["I"], counted["U"], counted["D"])
            # The key's first operation (which conflict a row found by it meets: subscriber/origin_conflicts.py) and,
            # when every change of the key is one remote transaction's, that transaction (named by a conflict).
            first, last = ops[0], ops[-1]
            one = first.commit_lsn == last.commit_lsn
            self.keys.append((target.index, at, json_array(key), *n, json_array(vals), *present[1:], *absent[1:], first.op,
                              first.commit_lsn if one else None, first.xid if one else None))


# An outcome: (vals, present, flags, conflict_lsn, conflict_xid, missing_update, missing_delete)
_Outcome = tuple


def _single(o: Change, rule: Step, missing_update: int, missing_delete: int) -> _Outcome:
    """A key's only change, by its rule (core/apply/fold_rules.py ``step``) from a start where the key existed or not;
    ``missing_update``, ``missing_delete``: what the rule counts (:func:`_single_rules`)."""
    conflict = rule.conflict
    return (None, rule.present, single_flags(rule, o.flags), o.commit_lsn if conflict else None,
            o.xid if conflict else None, missing_update, missing_delete)


def _single_rules(rules: dict[tuple[str, bool], Step]) -> dict[str, tuple[tuple[Step, int, int], ...]]:
    """Each operation's rule where the key existed and where not, with its counts: looked up once per key."""
    return {op: tuple((rule, int(rule.counted == "missing_update"), int(rule.counted == "missing_delete"))
                      for rule in (rules[op, True], rules[op, False])) for op in OPERATIONS}


#: A rule of the fold as the walk reads it per change: (row after, cells, conflict, counted).
_Rule = tuple[bool, str, bool, str | None]


def _fold_table(rules: dict[tuple[str, bool], Step]) -> dict[tuple[str, bool], _Rule]:
    """core/apply/fold_rules.py ``steps`` as tuples, unpacked per change faster than a Step's fields are read."""
    return {k: (r.present, r.cells, r.conflict, r.counted) for k, r in rules.items()}


def _folded(ops: Sequence[Change], existed: bool, table: dict[tuple[str, bool], _Rule], width: int) -> _Outcome:
    """A key's changes folded in commit order, each by its rule (core/apply/fold_rules.py ``steps``, as
    :func:`_fold_table`): a value and a flag per column (2: the subscriber's current value), the first conflict,
    the UPDATEs and DELETEs that found no row."""
    present, flags = existed, [2] * width
    vals: list[str | None] = [None] * width
    clsn = cxid = None
    missing_update = missing_delete = 0
    for o in ops:
        after, cells, conflict, counted = table[o.op, present]
        if conflict and clsn is None:
            clsn, cxid = o.commit_lsn, o.xid
        if cells == "set":
            vals, flags = list(o.vals or ()), [int(f) for f in o.flags or ""]  # an INSERT has both
        elif cells != "keep":
            if cells == "restart":  # a new row from the cells the change carries, the others their default
                vals, flags = [None] * width, [1] * width
            carried = o.vals or []  # an UPDATE has its values and flags
            for i, f in enumerate(o.flags or ""):
                if f == "0":
                    vals[i], flags[i] = carried[i], 0
        if counted == "missing_update":
            missing_update += 1
        elif counted == "missing_delete":
            missing_delete += 1
        present = after
    return (vals, present, "".join(map(str, flags)), clsn, cxid, missing_update, missing_delete)
