"""A batch the publisher judged, reduced on its Arrow columns: no Python per change.

flows/apply/net_effect.py reduces a batch the publisher judged (``filtering: source``) by walking every change
in Python, about 12 µs each; a batch over flows/apply/reducers.py ``IN_PROCESS_BATCH_CHANGES`` went to Spark,
whose fixed costs (a JVM, planning, persisting, a collect or a Python worker per partition) made a
1M-row transaction 7 times slower than PostgreSQL's own apply (docs/benchmarks.md). Most batches need
none of that: their keys each change once (an UPDATE of many rows, a bulk INSERT) and no change cuts a
table's changes into phases. Such a key's net effect is ``_single``'s, column by column, computed here
by Arrow compute functions over the whole batch at once (pyarrow.compute runs in C++ and releases the
GIL); so is that of a key changed only by UPDATEs that carry every column (the last one wins: a
counter row updated by every transaction). Any other key changed more than once is folded by
change_rows.py's own ``_folded``. What the rules are is core/apply/fold_rules.py's (docs/adr/two-reducers-one-fold.md):
the kernels are derived from its table, and the fold's truth table holds them to the same outcomes and
facts as the walk (tests/apply/test_fold.py).

A batch this module does not take (:func:`reduce_columns` returns None) goes to the reducer it went to
before: a barrier (a TRUNCATE, an UPDATE that changes the key, an UPDATE or DELETE of a table without a
key), an unchanged TOASTed value, a row shorter than its relation, or more changes of repeated keys than
the fold in Python is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_rowfilter.core.apply.fold_rules import OPERATIONS, RepeatedUpdates, repeated_updates, step
from airflow_provider_rowfilter.core.apply.plan import PASS_THROUGH, ApplyPlan, BatchFacts, TargetPlan, read_facts
from airflow_provider_rowfilter.flows.apply.change_rows import (
    CHANGE_COLUMNS,
    ENCODE,
    ROW_COLUMNS,
    Change,
    Layout,
    Stage,
    layout_ids,
)
from airflow_provider_rowfilter.subscriber.apply_stage import arrow_schema

_OPS = {"insert": "I", "update": "U", "delete": "D", "truncate": "T"}


def reduce_columns(segments: Sequence[pa.Table], plan: ApplyPlan, token: str,
                   fold_limit: int) -> tuple[BatchFacts, pa.Table] | None:
    """The facts and the staged rows of a batch the publisher judged, or None when it is not one this module takes.

    :param segments: the batch's change-log rows, with at least net_effect.py ``CHANGE_COLUMNS``.
    :param fold_limit: at most this many changes (of keys changed more than once) are folded in Python.
    """
    if any(rules != PASS_THROUGH for t in plan.targets for rules in t.rules):
        raise ValueError("only a batch the publisher judged (every table PASS_THROUGH) is reduced here")
    tables = [s.select(list(CHANGE_COLUMNS)) for s in segments if s.num_rows]
    if not tables:
        return None
    batch = pa.concat_tables(tables).combine_chunks()
    targets = list(plan.targets)
    target_of = _routes(batch, targets)
    # the rows of a table the batch applies, at or past the table's position (as net_effect.py skips them)
    position = np.array([t.position for t in targets] + [0], np.int64)[target_of]
    kept = np.flatnonzero((target_of >= 0) & (batch.column("commit_lsn").to_numpy() >= position))
    if not len(kept):
        return None
    if len(kept) < batch.num_rows:
        batch, target_of = batch.take(pa.array(kept)), target_of[kept]
    commit = batch.column("commit_lsn").to_numpy()
    ops = _ops(batch.column("kind"))
    if plan.skip_lsn is not None:
        ops[commit == plan.skip_lsn] = "s"
    if (ops == "T").any():
        return None
    live = ops != "s"
    if pc.any(pc.list_flatten(batch.column("new_unchanged").filter(pa.array(live)))).as_py():
        return None  # an unchanged TOASTed value: net_effect.py takes the old row's or keeps the subscriber's
    layout_of, layout_names = _layouts(batch.column("column_names"))
    routed = []  # per target and layout: its rows, their keys, values and flags
    for t, target in enumerate(targets):
        for lay, names in enumerate(layout_names):
            rows = np.flatnonzero((target_of == t) & (layout_of == lay) & live)
            if len(rows):
                found = _route_layout(batch, rows, ops[rows], target, names)
                if found is None:
                    return None
                routed.append((rows, *found))
    facts = read_facts(plan, _groups(target_of, layout_of, layout_names, ops, commit, batch, targets))
    if not routed:
        return facts, arrow_schema().empty_table()
    rows = np.concatenate([r[0] for r in routed])
    keys, vals, flags = (pa.concat_arrays([r[i] for r in routed]) for i in (1, 2, 3))
    # A key changed once is vectorised, and so is one changed only by UPDATEs that carry every column (its last
    # one wins); any other key changed more than once is folded in Python.
    encoded = keys.dictionary_encode()  # a number per key, then per table and key
    codes = target_of[rows] * len(encoded.dictionary) + encoded.indices.to_numpy()
    codes = np.unique(codes, return_inverse=True)[1].reshape(-1)
    repeated = np.bincount(codes)[codes] > 1
    full_update = (ops[rows] == "U") & ~pc.match_substring_regex(flags, "[^0]").fill_null(True).to_numpy(
        zero_copy_only=False)
    updated = repeated & (np.bincount(codes, weights=~full_update)[codes] == 0)
    if _repeated_updates(plan.policy) is None:
        updated[:] = False  # folded by the walk below
    walked = repeated & ~updated
    if walked.sum() > fold_limit:
        return None
    single = pa.array(~repeated)
    parts = [_singles(batch, rows[~repeated], target_of, targets, ops, keys.filter(single), vals.filter(single),
                      flags.filter(single), plan.policy, token)]
    if updated.any():
        parts.append(_last_updates(batch, rows, codes, updated, target_of, targets, keys, vals, flags, plan.policy,
                                   token))
    if walked.any():
        parts.append(_folded(batch, rows[walked], target_of, targets, layout_of, layout_names, ops, plan, token))
    return facts, pa.concat_tables(parts)


def _routes(batch: pa.Table, targets: list[TargetPlan]) -> np.ndarray:
    """Each row's target (its place in ``targets``), -1 for a table the batch does not apply."""
    routes = {(leaf.schema, leaf.name): t for t in targets for leaf in t.leaves}
    place = {t.index: n for n, t in enumerate(targets)}
    leaf = pc.binary_join_element_wise(batch.column("schema"), batch.column("table"), "\x00")
    encoded = (leaf.combine_chunks() if isinstance(leaf, pa.ChunkedArray) else leaf).dictionary_encode()
    found = [routes.get(tuple(n.split("\x00", 1))) for n in encoded.dictionary.to_pylist()]
    of_entry = np.array([-1 if t is None else place[t.index] for t in found] or [-1], np.int64)
    return of_entry[encoded.indices.to_numpy(zero_copy_only=False)] if len(encoded) else np.zeros(0, np.int64)


def _ops(kind: pa.ChunkedArray) -> np.ndarray:
    """Each change's operation letter, looked up once per distinct kind."""
    encoded = kind.combine_chunks().dictionary_encode()
    letters = np.array([_OPS[k] for k in encoded.dictionary.to_pylist()], dtype="<U1")
    return letters[encoded.indices.to_numpy(zero_copy_only=False)]


def _layouts(column_names: pa.ChunkedArray) -> tuple[np.ndarray, list[tuple[str, ...]]]:
    ids, names = layout_ids(column_names)
    return np.asarray(ids, np.int64), names


def _json_items(values: pa.Array) -> pa.Array:
    """Each value as an item of a JSON array, as change_rows.py ``json_array`` writes it: ``null``, or the string
    quoted with ``"`` and ``\\`` escaped (control characters, rare, by Python's own encoder)."""
    quoted = pc.binary_join_element_wise('"', values, '"', "")
    escape = pc.match_substring_regex(values, r'[\x00-\x1f"\\]').fill_null(False)
    if pc.any(escape).as_py():  # only the values that need it are escaped
        some = values.filter(escape)
        escaped = pc.replace_substring(pc.replace_substring(some, "\\", "\\\\"), '"', '\\"')
        escaped = pc.binary_join_element_wise('"', escaped, '"', "")
        control = pc.match_substring_regex(some, r"[\x00-\x1f]")
        if pc.any(control).as_py():
            at = np.flatnonzero(control.to_numpy(zero_copy_only=False))
            exact = [ENCODE(v) for v in some.take(pa.array(at)).to_pylist()]
            escaped = pc.replace_with_mask(escaped, control, pa.array(exact, pa.string()))
        quoted = pc.replace_with_mask(quoted, escape, escaped)
    return quoted.fill_null("null")


def _json_rows(items: list[pa.Array]) -> pa.Array:
    """JSON arrays of the items, one per row (``[a,b]``)."""
    return pc.binary_join_element_wise("[", pc.binary_join_element_wise(*items, ","), "]", "")


def _at(values: pa.Array, positions: Sequence[int | None]) -> pa.Array:
    """The JSON array of the values at ``positions`` of each row's list (None: a column the relation lacks,
    NULL); NULL where the row has no list."""
    nulls = pa.nulls(len(values), pa.string())
    if len(values) and list(positions) == list(range(len(positions))) and values.offsets[0].as_py() == 0 \
            and pc.all(pc.equal(pc.list_value_length(values).drop_null(), len(positions))).as_py() is not False:
        # every value of each list, in its order: the lists' values made items in one pass, joined per list
        offsets = pc.fill_null(values.offsets, 0)  # a NULL list's offset is its neighbour's: no items
        items = pa.ListArray.from_arrays(offsets, _json_items(values.values.slice(0, offsets[-1].as_py())))
        rows = pc.binary_join_element_wise("[", pc.binary_join(items, ","), "]", "")
    else:
        rows = _json_rows([_json_items(nulls if p is None else pc.list_element(values, p)) for p in positions])
    return rows if not values.null_count else pc.if_else(values.is_valid(), rows, nulls)


def _route_layout(batch: pa.Table, rows: np.ndarray, op: np.ndarray, target: TargetPlan,
                  names: tuple[str, ...]) -> tuple[pa.Array, pa.Array, pa.Array] | None:
    """The keys, values and flags of one target's rows of one relation layout (change_rows.py ``Layout.change``); None when
    one of them is a barrier or its lists do not have the layout's width."""
    layout = Layout(target, names)
    if not layout.columns:
        return None
    every = len(rows) == batch.num_rows
    taken = pa.array(rows)
    new, old = (batch.column(c).combine_chunks() if every else batch.column(c).take(taken).combine_chunks()
                for c in ("new_values", "old_values"))
    for lists in (new, old):
        lengths = pc.list_value_length(lists).drop_null()
        if len(lengths) and (pc.min(lengths).as_py() != layout.width or pc.max(lengths).as_py() != layout.width):
            return None
    ins, upd, dele = pa.array(op == "I"), pa.array(op == "U"), pa.array(op == "D")
    if pc.any(pc.and_(dele, old.is_null())).as_py():
        return None  # a DELETE without its old row (pgoutput always sends one): the walk's rule
    if target.key:
        new_key = _at(new, layout.key)
        if old.null_count == len(old):
            keys = new_key
        else:
            old_key = _at(old, layout.key)
            # an UPDATE that changes the key is a barrier (change_rows.py ``Layout.change``)
            if pc.any(pc.and_(upd, pc.not_equal(old_key, new_key)).fill_null(False)).as_py():
                return None
            keys = pc.if_else(dele, old_key, new_key)
    else:
        if pc.any(pc.or_(upd, dele)).as_py():
            return None  # found by its old row, one statement each: a barrier
        keys = _json_rows([_json_items(pc.cast(batch.column(c) if every else batch.column(c).take(taken), pa.string())
                                       .combine_chunks()) for c in ("commit_lsn", "seq")])
    written = pc.or_(ins, upd)
    vals = pc.if_else(written, _at(new, layout.columns), pa.nulls(len(rows), pa.string()))
    flags = pc.if_else(written, pa.scalar(layout.flags), pa.nulls(len(rows), pa.string()))
    return keys, vals, flags


def _groups(target_of: np.ndarray, layout_of: np.ndarray, layout_names: list[tuple[str, ...]], ops: np.ndarray,
            commit: np.ndarray, batch: pa.Table, targets: list[TargetPlan]) -> list[dict]:
    """The facts' groups (net_effect.py ``reduce_changes``): changes and the first commit per table, layout,
    kind and operation."""
    grouped = pa.table({"t": target_of, "lay": layout_of, "kind": batch.column("kind"), "op": pa.array(ops),
                        "commit": commit}).group_by(["t", "lay", "kind", "op"]).aggregate(
        [("commit", "count"), ("commit", "min")])
    return [{"_tgt": targets[g["t"]].index, "_epoch": 0, "kind": g["kind"], "_op": g["op"], "_barrier": False,
             "layout": layout_names[g["lay"]] if g["op"] in ("I", "U") else None, "n": g["commit_count"],
             "first": g["commit_min"]} for g in grouped.to_pylist()]


def _singles(batch: pa.Table, rows: np.ndarray, target_of: np.ndarray, targets: list[TargetPlan], ops: np.ndarray,
             keys: pa.Array, vals: pa.Array, flag: pa.Array, policy: str, token: str) -> pa.Table:
    """The staged rows of keys changed once: each operation's rule (core/apply/fold_rules.py ``step``) from both starts,
    column by column."""
    n = len(rows)
    op = ops[rows]
    masks = {o: op == o for o in OPERATIONS}
    index = np.array([t.index for t in targets], np.int32)[target_of[rows]]
    taken = pa.array(rows)
    commit, xid = batch.column("commit_lsn").take(taken).combine_chunks(), batch.column("xid").take(taken).combine_chunks()
    columns = {
        "target": pa.array(index, pa.int32()), "phase": pa.array(np.zeros(n, np.int32)),
        "row_kind": pa.array(["K"] * n, pa.string()), "key": keys,
        "n_insert": pa.array(masks["I"].astype(np.int64)), "n_update": pa.array(masks["U"].astype(np.int64)),
        "n_delete": pa.array(masks["D"].astype(np.int64)), "vals": vals,
        **_single_outcomes("p", True, policy, masks, flag, commit, xid),
        **_single_outcomes("a", False, policy, masks, flag, commit, xid),
        # the key's first operation and the one transaction of its one change (change_rows.py Stage.add)
        "op": pa.array(op.astype(str), pa.string()), "commit_lsn": commit, "xid": xid,
    }
    schema = arrow_schema()
    return pa.Table.from_arrays(
        [pa.array([token] * n, pa.string()) if f.name == "token" else
         columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema], schema=schema)


def _single_outcomes(side: str, existed: bool, policy: str, masks: dict[str, np.ndarray], flag: pa.Array,
                     commit: pa.Array, xid: pa.Array) -> dict[str, pa.Array]:
    """One side's outcome of each key's only change, its operation's rule applied to every change of that
    operation at once (core/apply/fold_rules.py ``step``, ``single_flags``)."""
    n = len(flag)
    present, conflict = np.zeros(n, bool), np.zeros(n, bool)
    counted = {"missing_update": np.zeros(n, np.int64), "missing_delete": np.zeros(n, np.int64)}
    kernels: dict[str | None, list[np.ndarray]] = {}  # the flags' kernel, and the operations' rows it serves
    for op, mask in masks.items():
        rule = step(op, existed, policy)
        present |= mask & rule.present
        conflict |= mask & rule.conflict
        if rule.counted is not None:
            counted[rule.counted] += mask
        kernels.setdefault(rule.cells if rule.present else None, []).append(mask)
    flags = pa.nulls(n, pa.string())
    for kind, served in kernels.items():
        if kind is None:
            continue
        kernel = (pc.replace_substring(flag, "1", "2") if kind == "overlay"
                  else pc.replace_substring_regex(flag, "[01]", "2") if kind == "keep" else flag)
        mask = np.logical_or.reduce(served)
        flags = kernel if mask.all() else pc.if_else(pa.array(mask), kernel, flags)
    nothing = pa.nulls(n, pa.int64())
    return {f"{side}_present": pa.array(present), f"{side}_flags": flags,
            f"{side}_conflict_lsn": pc.if_else(pa.array(conflict), commit, nothing) if conflict.any() else nothing,
            f"{side}_conflict_xid": pc.if_else(pa.array(conflict), xid, nothing) if conflict.any() else nothing,
            f"{side}_missing_update": pa.array(counted["missing_update"]),
            f"{side}_missing_delete": pa.array(counted["missing_delete"])}


def _last_updates(batch: pa.Table, rows: np.ndarray, codes: np.ndarray, updated: np.ndarray, target_of: np.ndarray,
                  targets: list[TargetPlan], keys: pa.Array, vals: pa.Array, flags: pa.Array, policy: str,
                  token: str) -> pa.Table:
    """The staged rows of keys changed only by UPDATEs that carry every column: the fold of such changes per key at
    once (core/apply/fold_rules.py ``repeated_updates``, from both starts; :func:`_repeated_updates` says when it
    applies). Under the rules today: where the key existed, every UPDATE finds it and the last one's values are
    left (flags all 0); where it did not, each finds nothing (flags all 2, the cells never set), or, under
    upsert, the first inserts and the others update (the last one's values, flags all 0)."""
    sides = _repeated_updates(policy)
    assert sides is not None, "reduce_columns folds such keys in Python under this policy"
    at = np.flatnonzero(updated)
    commit = batch.column("commit_lsn").to_numpy()[rows[at]]
    seq = batch.column("seq").to_numpy()[rows[at]]
    ordered = at[np.lexsort((seq, commit, codes[at]))]
    last = ordered[np.append(codes[ordered][1:] != codes[ordered][:-1], True)]  # each key's last change
    first = ordered[np.insert(codes[ordered][1:] != codes[ordered][:-1], 0, True)]  # and its first, in key order
    n = len(last)
    count = np.bincount(codes[at], minlength=codes.max() + 1)[codes[last]].astype(np.int64)
    taken = pa.array(last)
    flag = flags.take(taken)
    zeros, nothing_int = pa.array(np.zeros(n, np.int64)), pa.nulls(n, pa.int64())
    first_commit = batch.column("commit_lsn").to_numpy()[rows[first]]
    first_xid = batch.column("xid").to_numpy()[rows[first]]
    one = first_commit == batch.column("commit_lsn").to_numpy()[rows[last]]
    columns = {
        "target": pa.array(np.array([t.index for t in targets], np.int32)[target_of[rows[last]]], pa.int32()),
        "phase": pa.array(np.zeros(n, np.int32)), "row_kind": pa.array(["K"] * n, pa.string()),
        "key": keys.take(taken), "n_insert": zeros, "n_update": pa.array(count), "n_delete": zeros,
        "vals": vals.take(taken),
        **{column: value for side, rule in zip("pa", sides, strict=True) for column, value in (
            (f"{side}_present", pa.array(np.full(n, rule.present))),
            # the last UPDATE's cells (flags 0), or the start's (the subscriber's: flags 2)
            (f"{side}_flags", flag if rule.last_values else pc.replace_substring(flag, "0", "2")),
            (f"{side}_conflict_lsn", nothing_int), (f"{side}_conflict_xid", nothing_int),
            (f"{side}_missing_update", pa.array(rule.missing_update_first + (count - 1) * rule.missing_update_after)),
            (f"{side}_missing_delete", zeros))},
        # the key's first operation, and its transaction when all its changes are one's (change_rows.py Stage.add)
        "op": pa.array(["U"] * n, pa.string()),
        "commit_lsn": pa.array(np.where(one, first_commit, 0), pa.int64(), mask=~one),
        "xid": pa.array(np.where(one, first_xid, 0), pa.int64(), mask=~one),
    }
    schema = arrow_schema()
    return pa.Table.from_arrays(
        [pa.array([token] * n, pa.string()) if f.name == "token" else
         columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema], schema=schema)


def _repeated_updates(policy: str) -> tuple[RepeatedUpdates, RepeatedUpdates] | None:
    """The fold of repeated full UPDATEs where the key existed and where it did not, when the rules let it be
    computed from the count alone and the staged values are the last UPDATE's (the side that leaves a row)."""
    existed, absent = repeated_updates(True, policy), repeated_updates(False, policy)
    if existed is None or absent is None or not (existed if existed.present else absent).last_values:
        return None
    return existed, absent


def _folded(batch: pa.Table, rows: np.ndarray, target_of: np.ndarray, targets: list[TargetPlan],
            layout_of: np.ndarray, layout_names: list[tuple[str, ...]], ops: np.ndarray, plan: ApplyPlan,
            token: str) -> pa.Table:
    """The staged rows of keys changed more than once, folded by change_rows.py (``Layout.change``, ``Stage``)."""
    picked = batch.take(pa.array(rows)).select(list(ROW_COLUMNS)).to_pylist()
    layouts: dict[tuple[int, int], Layout] = {}
    changes: dict[int, list[Change]] = {}
    for i, r in zip(rows.tolist(), picked, strict=True):
        t, lay = int(target_of[i]), int(layout_of[i])
        layout = layouts.get((t, lay))
        if layout is None:
            layout = layouts[t, lay] = Layout(targets[t], layout_names[lay])
        change = layout.change(str(ops[i]), r["commit_lsn"], r["seq"], r["xid"], r["replica_identity"],
                               r["new_values"], None, r["old_kind"], r["old_values"])
        changes.setdefault(t, []).append(change)
    stage = Stage(token)
    for t, kept in changes.items():
        stage.add(targets[t], kept, plan.policy)
    return stage.table()
