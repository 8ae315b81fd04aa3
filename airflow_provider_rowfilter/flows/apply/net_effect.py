"""A batch the publisher has already judged (``filtering: source``), reduced per key in the job's own process.

pgoutput has evaluated the publications for every change of such a batch: the publish lists, the row
filters on the old and the new row, the UPDATE turned into INSERT or DELETE, the column lists
(pgoutput_change and pgoutput_row_filter in src/backend/replication/pgoutput/pgoutput.c), so every
table takes ``core/apply_plan.PASS_THROUGH`` and nothing is left to judge. What is left of
spark/apply_frames.py is routing each change to its table, its key, values and flags, and the reduction
of each key's changes to their net effect; for a batch of up to
flows/apply/reducers.py ``IN_PROCESS_BATCH_CHANGES`` changes that costs less here, in one pass over Arrow
columns, than Spark's fixed cost per action (docs/apply.md "Batches the publisher judged"). So the apply
of such a batch starts no Spark at all, and ApplyChangesOperator's task applies it without submitting the
job.

The contract is the one Spark's ``DecidedBatch.collected`` keeps (flows/apply/reducers.py): the change-log
rows of the batch's segments in, as Arrow tables; the batch's facts (core/apply/plan.py ``read_facts``)
and the rows of ``rowfilter.apply_stage`` (subscriber/apply_stage.py ``STAGE_COLUMNS``) out, which
subscriber/apply_target.py applies unchanged. Each step below names the step of Spark's it mirrors
(spark/judge.py ``judged_frame``, spark/apply_frames.py ``staged``, spark/fold_expressions.py ``single``,
``folded``); the fold's rules themselves are core/apply/fold_rules.py's, which flows/apply/change_rows.py ``_single``
and ``_folded`` apply. Why the reduction exists in several engines and how they are held equal:
docs/adr/two-reducers-one-fold.md. The fold's truth table runs through
both, without a database (tests/apply/test_fold.py); the differential tests run every source-filtered
case through this path and through Spark's, against PostgreSQL's own subscription; the random workload
reduces each of its source-filtered batches both ways and requires the same facts and rows
(tests/e2e/jobs/test_apply_differential.py, tests/e2e/jobs/test_apply_random.py).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_rowfilter.core.apply.plan import PASS_THROUGH, ApplyPlan, BatchFacts, TargetPlan, read_facts
from airflow_provider_rowfilter.flows.apply.change_rows import ROW_COLUMNS, Change, Layout, Stage, layout_ids

_OPS = {"insert": "I", "update": "U", "delete": "D", "truncate": "T"}
def reduce_changes(segments: Iterable[pa.Table], plan: ApplyPlan, token: str,
                   exact: frozenset[int] = frozenset()) -> tuple[BatchFacts, pa.Table]:
    """:func:`reduce_batch` change by change, in Python: every batch the publisher judged."""
    if any(rules != PASS_THROUGH for t in plan.targets for rules in t.rules):
        raise ValueError("only a batch the publisher judged (every table PASS_THROUGH) is reduced here")
    routes = {(leaf.schema, leaf.name): t for t in plan.targets for leaf in t.leaves}
    groups: Counter = Counter()  # (layout, kind, op, barrier) -> changes
    firsts: dict[tuple, int] = {}
    changes: dict[int, list[Change]] = defaultdict(list)
    truncates: dict[tuple[int, int, int], list] = {}
    layouts: dict[tuple[int, tuple[str, ...]], Layout] = {}
    skip_lsn = plan.skip_lsn
    targets = list(plan.targets)
    for segment in segments:
        layout_of, layout_names = layout_ids(segment.column("column_names"))
        target_of = _routes(segment, routes, targets)
        unchanged_of = _toasted(segment.column("new_unchanged"))
        columns = [segment.column(c).to_pylist() for c in ROW_COLUMNS]
        here: dict[int, Layout] = {}  # by target and this segment's layout number
        for i, row in enumerate(zip(*columns, strict=True)):
            t = target_of[i]
            if t < 0:
                continue
            commit_lsn, seq, lsn, xid, kind, schema, table, identity, new, old_kind, old, restart = row
            target = targets[t]
            if commit_lsn < target.position:
                continue
            number = t * len(layout_names) + layout_of[i]
            layout = here.get(number)
            if layout is None:
                names = layout_names[layout_of[i]]
                layout = layouts.get((target.index, names))
                if layout is None:
                    layout = layouts[target.index, names] = Layout(target, names)
                here[number] = layout
            unchanged = unchanged_of.get(i)
            op = "s" if commit_lsn == skip_lsn else _OPS[kind]
            change = layout.change(op, commit_lsn, seq, xid, identity, new, unchanged, old_kind, old)
            group = (layout, kind, change.op, change.barrier)
            groups[group] += 1
            if group not in firsts or commit_lsn < firsts[group]:
                firsts[group] = commit_lsn
            if change.op == "T":
                # One TRUNCATE statement lists every leaf it emptied (pgoutput.c pgoutput_truncate): one barrier.
                truncate = truncates.setdefault((target.index, commit_lsn, lsn), [set(), seq, xid, restart])
                truncate[0].add((schema, table))
                truncate[1] = min(truncate[1], seq)
                truncate[3] = restart if truncate[3] is None else truncate[3] or bool(restart)  # max()
            elif change.op in ("I", "U", "D"):
                changes[target.index].append(change)
    facts = read_facts(plan, ({"_tgt": lay.target.index, "_epoch": 0, "kind": k, "_op": o, "_barrier": b,
                               "layout": lay.names if o in ("I", "U") else None, "n": n,
                               "first": firsts[lay, k, o, b]} for (lay, k, o, b), n in groups.items()))
    by_index = {t.index: t for t in plan.targets}
    for (index, commit_lsn, _), (leaves, seq, xid, restart) in truncates.items():
        if len(leaves) == len(by_index[index].leaves):
            changes[index].append(Change(commit_lsn, seq, xid, "T", None, None, None, True, restart))
    stage = Stage(token)
    for index, kept in changes.items():
        stage.add(by_index[index], kept, plan.policy, exact=index in exact)
    return facts, stage.table()


def _routes(segment: pa.Table, routes: dict[tuple[str, str], TargetPlan], targets: list[TargetPlan]) -> list[int]:
    """Each row's target (its place in ``targets``), -1 for a table the batch does not apply: a segment holds a
    handful of tables, so each is looked up once, not once per row."""
    leaf = pc.binary_join_element_wise(segment.column("schema"), segment.column("table"), "\x00")
    encoded = leaf.combine_chunks().dictionary_encode()
    place = {t.index: n for n, t in enumerate(targets)}
    found = [routes.get((schema, table)) for schema, table in (n.split("\x00", 1) for n in encoded.dictionary.to_pylist())]
    of_entry = np.array([-1 if t is None else place[t.index] for t in found] or [-1], np.int64)
    return of_entry[encoded.indices.to_numpy(zero_copy_only=False)].tolist() if len(encoded) else []


def _toasted(new_unchanged: pa.ChunkedArray) -> dict[int, list[bool]]:
    """The rows with an unchanged TOASTed value (few), with their flags; the others have none."""
    flat = pc.list_flatten(new_unchanged)
    rows = sorted(set(pc.list_parent_indices(new_unchanged).filter(flat).to_pylist())) if len(flat) else []
    return {i: new_unchanged[i].as_py() for i in rows}
