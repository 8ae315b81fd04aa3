"""A batch reduced to its net effect per key and staged in the subscriber, by one of two reducers.

Both reducers keep one contract (docs/adr/two-reducers-one-fold.md): the batch's change-log rows, the
plan (core/apply/plan.py) and a staging token in; the batch's facts (``BatchFacts``: what was filtered
or transformed, which columns each table is sent, which tables need phases) and the rows of
``rowfilter.apply_stage`` (subscriber/apply_stage.py ``STAGE_COLUMNS``) out. Which one runs:

- a batch the publisher judged (``filtering: source``) of at most :data:`IN_PROCESS_BATCH_CHANGES`
  changes is reduced in this process from Arrow tables (flows/apply/net_effect.py): no Spark at all; so is
  one of at most :data:`COLUMNS_BATCH_CHANGES` whose keys allow a reduction on its Arrow columns
  (flows/apply/arrow_fold.py);
- any other batch is judged and reduced by Spark (spark/apply_frames.py), in the run's one session,
  started by the first batch that needs it. A batch of at most :data:`COLLECTED_BATCH_CHANGES`
  changes comes back to this process in one Spark action and is COPYed from here; a larger one is
  COPYed into the stage by the executors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_rowfilter.core.apply.plan import ApplyPlan, BatchFacts
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply import arrow_fold, net_effect
from airflow_provider_rowfilter.flows.apply.batch_plan import BatchPlan
from airflow_provider_rowfilter.flows.apply.change_rows import CHANGE_COLUMNS
from airflow_provider_rowfilter.flows.apply.result import ApplyResult
from airflow_provider_rowfilter.flows.spark_on_demand import SparkOnDemand
from airflow_provider_rowfilter.spark.settings import SHORT_BATCH_CHANGES
from airflow_provider_rowfilter.subscriber.apply_stage import clear_stage, copy_stage_rows, new_token
from airflow_provider_rowfilter.subscriber.apply_target import ApplyTarget
from airflow_provider_rowfilter.subscriber.copy_target import executor_conninfo

if TYPE_CHECKING:  # the job starts Spark only when a batch has changes to judge
    pass

#: A batch the publisher judged (``filtering: source``) of at most this many changes (the log's count)
#: is reduced in the job's own process and starts no Spark (flows/apply/net_effect.py); a larger one
#: goes to Spark, whose executors scale out (docs/apply.md, "Batches the publisher judged").
IN_PROCESS_BATCH_CHANGES = 200_000
#: A larger batch the publisher judged, of at most this many changes, is reduced in the job's process too when
#: its keys allow it (flows/apply/arrow_fold.py: no barrier, repeated keys' changes within IN_PROCESS_BATCH_CHANGES),
#: on its Arrow columns: a 1M-row transaction without Spark. Its columns and staged rows are held in memory at
#: once, about 0.75 KB a change at the peak for pgbench's accounts (docs/apply.md); a batch past this, or
#: one that does not allow it, goes to Spark.
COLUMNS_BATCH_CHANGES = 1_000_000
#: A batch of at most this many changes (the log's count) is summarised and staged in one Spark
#: action, its rows collected as Arrow (a few MB) and COPYed from the job's own process,
#: so no Python worker starts (docs/apply.md, "Small batches").
COLLECTED_BATCH_CHANGES = 50_000


@dataclass
class Staged:
    """What the reduction left for the batch's transaction: the stage's token and the facts it needs."""

    token: str
    extra: dict[int, dict[str, int]] = field(default_factory=dict)  # per target: filtered, update_to_insert, …
    skipped: bool = False  # the transaction being skipped is in the batch
    rows: pa.Table | None = None  # the stage's rows when reduced in this process, not yet written


def reduce(spec: SubscriptionSpec, sub: psycopg.Connection, batch: BatchPlan, result: ApplyResult,
           spark: SparkOnDemand, held: Mapping[str, pa.Table] | None = None) -> Staged:
    """Reduce the batch's changes to their net effect per key, checked against its tables, and stage them.

    Clears what earlier attempts of the subscription left in the stage first. Records in ``result`` the
    batch's segments, transactions and changes. ``held``: segments' rows this process captured and still holds,
    by path (:func:`reduce_here`).

    :raises ApplyTargetError: a table is sent a column it lacks, or an UPDATE or DELETE it has no key for.
    :raises SparkNeeded: the batch needs Spark and the run may not start it.
    """
    clear_stage(sub, spec.subscription)
    staged = Staged(new_token(spec.subscription))
    if batch.plan is None:
        return staged
    changes = batch.logged_changes
    reduced = reduce_here(batch, staged.token, held) if batch.filtering == "source" else None
    if reduced is not None:
        # staged by the batch's own transaction (flows/apply/batch_transaction.py): written once, where it is applied
        facts, staged.rows = reduced
        staged.extra, staged.skipped, result.changes = _checked(facts, batch.targets)
    else:
        # A JVM of our own that lives for one short batch compiles for a short life (spark/settings.py).
        short = batch.whole and (result.capture is None or not result.capture["more"]) \
            and changes <= SHORT_BATCH_CHANGES
        session = spark.get(short_batch=short)
        from airflow_provider_rowfilter.spark.apply_frames import decide, write_stage

        # A small batch is judged and staged by one Spark action, its rows COPYed from here (docs/apply.md).
        small = changes <= COLLECTED_BATCH_CHANGES
        conninfo = executor_conninfo(spec.subscriber, "subscriber", f"rowfilter:{spec.subscription}:apply")
        decided = decide(session, batch.paths, batch.plan, [c for _, c in batch.logged])
        try:
            exact = sorted(batch.exact)
            facts, collected = decided.collected(staged.token, exact) if small else (decided.facts(), None)
            staged.extra, staged.skipped, result.changes = _checked(facts, batch.targets)
            if collected is None:
                write_stage(decided.staged(staged.token, exact=exact), conninfo)
            else:
                copy_stage_rows(collected, conninfo)
        finally:
            decided.release()
    result.segments = len(batch.segments)
    result.transactions = sum(t for t, _ in batch.logged)
    return staged


def reduce_here(batch: BatchPlan, token: str, held: Mapping[str, pa.Table] | None = None
                ) -> tuple[BatchFacts, pa.Table] | None:
    """A batch pgoutput judged, reduced in this process without Spark: one of at most
    :data:`IN_PROCESS_BATCH_CHANGES` changes always (flows/apply/net_effect.py), one of at most
    :data:`COLUMNS_BATCH_CHANGES` when its keys allow it (flows/apply/arrow_fold.py); else None.

    A segment this process captured is taken from ``held`` (by its path: the capture's
    ``CaptureResult.held``, the rows it wrote into that very file), not read back; any other is read from the log.
    """
    assert batch.plan is not None
    changes = batch.logged_changes
    if changes > COLUMNS_BATCH_CHANGES:
        return None
    held = held or {}
    segments = [held[path] if path in held and held[path].num_rows == count
                else pq.read_table(path, columns=list(CHANGE_COLUMNS))
                for path, (_, count) in zip(batch.paths, batch.logged, strict=True)]
    if changes <= IN_PROCESS_BATCH_CHANGES:
        return reduce_batch(segments, batch.plan, token, batch.exact)
    if batch.exact:  # judged change by change: only the walk above does that (and Spark)
        return None
    return arrow_fold.reduce_columns(segments, batch.plan, token, fold_limit=IN_PROCESS_BATCH_CHANGES)


def reduce_batch(segments: Iterable[pa.Table], plan: ApplyPlan, token: str,
                 exact: frozenset[int] = frozenset()) -> tuple[BatchFacts, pa.Table]:
    """The facts and the staged rows of a batch the publisher judged (``filtering: source``).

    On the batch's Arrow columns when it allows it (flows/apply/arrow_fold.py: no barrier, no unchanged TOASTed
    value), else change by change (flows/apply/net_effect.py).

    :param segments: the batch's change-log rows, a table per segment in log order, with at least
        flows/apply/change_rows.py ``CHANGE_COLUMNS``.
    :param exact: the targets whose every change is a phase of its own (judged change by change:
        subscriber/change_by_change.py), which only the change-by-change walk stages.
    """
    segments = list(segments)
    reduced = None if exact else arrow_fold.reduce_columns(segments, plan, token,
                                                           fold_limit=sum(s.num_rows for s in segments))
    return reduced if reduced is not None else net_effect.reduce_changes(segments, plan, token, exact)


def _checked(facts: BatchFacts, targets: dict[int, ApplyTarget]) -> tuple[dict[int, dict[str, int]], bool, int]:
    """What the batch's facts let through: each table takes its published columns, and a table without a key
    gets no UPDATE or DELETE it cannot find (the first in commit order raises); returns the per-table counts,
    whether the transaction being skipped is in the batch, and its number of changes."""
    for index, published, first in facts.column_sets:
        targets[index].check_published(published, first)
    if facts.unkeyed:
        index, (first, kind) = min(facts.unkeyed.items(), key=lambda u: u[1])
        raise targets[index].not_updatable(kind, first)
    return facts.counts, facts.skipped, facts.changes
