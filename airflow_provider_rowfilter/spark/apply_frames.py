"""The apply batch on Spark: read the change log, judge every change as pgoutput would, reduce per key.

1. **Route**: each change's leaf goes to its subscriber table (the root under
   ``publish_via_partition_root``); only changes at or after the table's position count, and none of
   the transaction being skipped.
2. **Judge** (pgoutput_change, pgoutput_row_filter): the operation must be published; INSERT is
   filtered on the new row, DELETE on the old, UPDATE on the new alone without an old row and on
   both otherwise, then turned into INSERT or DELETE by the decision table (pgoutput_row_filter).
   Unchanged TOASTed values are taken from an old full row first (pgoutput_row_filter). TRUNCATE
   ignores filters (pgoutput_truncate).
3. **Project** each kept change on the subscriber's columns: value, "not carried" (a column outside
   the column list, one the publisher's table lacks, or an unchanged TOASTed value) — see
   subscriber/apply_target.py for what each flag means when written.
4. **Reduce**: changes between two *barriers* (TRUNCATE, an UPDATE that changes the key) are grouped
   by table, phase and key and folded in commit order into the key's net effect, once as if the
   key existed before the batch and once as if not; the subscriber chooses. A key's only change
   (most keys of a batch) is turned into its effect by an expression; only keys with several
   changes go through the fold, a higher-order function Spark interprets. A table without a key has
   nothing to group by: each INSERT is its own "key" (``[commit_lsn, seq]``), each UPDATE or DELETE a
   barrier found by its old row (REPLICA IDENTITY FULL) or, without FULL, op ``n``: the batch stops
   (docs/apply.md, "Tables without a key").
5. **Stage**: the result is COPYed into ``rowfilter.apply_stage`` from the executors; a small batch's
   facts and rows come to the driver in one action and are COPYed from there.

Steps 1 to 3 are spark/judge.py's, the fold of step 4 spark/fold_expressions.py's (built as sqlglot trees:
spark/sql_trees.py); this module cuts the phases, groups the keys, stages and writes.

Judging and reducing run in the JVM as projections Spark compiles whole (docs/apply.md, "Speed"):
the values are realigned once to the batch's columns so each read is positional, each filter is
evaluated once per row, and the judged batch is kept with ``localCheckpoint`` (rows as they are,
not re-encoded into the columnar cache). Only the staging write passes rows to Python, as Arrow.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from airflow_provider_rowfilter.core.apply.plan import ApplyPlan, BatchFacts, read_facts
from airflow_provider_rowfilter.spark.fold_expressions import folded, single, single_vals
from airflow_provider_rowfilter.spark.judge import judged_frame
from airflow_provider_rowfilter.spark.log_reader import segments_frame
from airflow_provider_rowfilter.spark.settings import SMALL_BATCH_SQL_SETTINGS
from airflow_provider_rowfilter.spark.sql_trees import lit, per_target, sql
from airflow_provider_rowfilter.subscriber.apply_stage import OUTCOME_FIELDS, STAGE_COLUMNS, copy_stage


@dataclass
class DecidedBatch:
    """The judged changes of a batch (checkpointed: summarised and reduced from one evaluation)."""

    frame: DataFrame
    plan: ApplyPlan
    _facts: BatchFacts | None = None

    def release(self) -> None:
        """Drop the checkpointed rows now, rather than when the JVM's garbage collector finds them."""
        cached: Any = getattr(self.frame, "_plan", None)
        if getattr(cached, "_relation_id", None) is not None:  # Spark Connect: a checkpoint the server keeps
            # Send now the RemoveRemoteCachedRelation its finalizer would send (pyspark.sql.connect.plan).
            cached.__del__()
            cached._relation_id = None
            return
        checkpointed = self.frame._jdf.queryExecution().analyzed()  # a LogicalRDD over the checkpoint
        if checkpointed.getClass().getSimpleName() == "LogicalRDD":
            checkpointed.rdd().unpersist(False)

    def facts(self) -> BatchFacts:
        if self._facts is None:
            self._facts = read_facts(self.plan, (row.asDict() for row in self._facts_frame().collect()))
        return self._facts

    def _facts_frame(self) -> DataFrame:
        layout = F.when(F.col("_op").isin("I", "U"), F.col("column_names"))
        return (self.frame.groupBy("_tgt", "_epoch", "kind", "_op", "_barrier", layout.alias("layout"))
                .agg(F.count(F.lit(1)).alias("n"), F.min("commit_lsn").alias("first")))

    def collected(self, token: str, exact: Sequence[int] = ()) -> tuple[BatchFacts, pa.Table]:
        """The facts and the staged rows of a small batch, from ONE Spark action, as Arrow in this process.

        For a batch of a few thousand changes Spark's fixed costs dominate: each action is a round of
        planning, scheduling (and, through Spark Connect, a round trip). So the facts and the staged
        rows are two branches of one query over the checkpointed changes, and the phases of every
        table are computed (a table without a barrier gets phase 0 all the same). The query runs with
        :data:`SMALL_BATCH_SQL_SETTINGS`.
        """
        facts = self._facts_frame()
        staged = self.staged(token, barrier_targets=sorted(t.index for t in self.plan.targets), exact=exact)
        both = (staged.select(F.lit("S").alias("_part"), *staged.columns, F.lit(None).cast("string").alias("_facts"))
                .unionByName(facts.select(F.lit("F").alias("_part"), F.to_json(F.struct(*facts.columns)).alias("_facts")),
                             allowMissingColumns=True))
        with _sql_settings(self.frame.sparkSession, SMALL_BATCH_SQL_SETTINGS):
            table = both.toArrow()
        part = table.column("_part")
        facts_rows = [json.loads(f) for f in table.filter(pc.equal(part, "F")).column("_facts").to_pylist()]
        self._facts = read_facts(self.plan, [{**dict.fromkeys(("layout", "_barrier")), **r} for r in facts_rows])
        return self._facts, table.filter(pc.equal(part, "S")).select(staged.columns)

    def staged(self, token: str, *, barrier_targets: Sequence[int] | None = None,
               exact: Sequence[int] = ()) -> DataFrame:
        """The rows for ``rowfilter.apply_stage``: net effect per key ('K'), and the barriers ('B').

        Changes are cut into phases for ``barrier_targets`` (default: the targets the facts found a
        barrier for); for the ``exact`` targets every change is a phase of its own (judged change by change:
        subscriber/change_by_change.py).
        """
        plan = self.plan
        kept = self.frame.where(F.col("_op").isin("I", "U", "D"))
        # One TRUNCATE statement lists every leaf it emptied; under publish_via_partition_root only the
        # root's own TRUNCATE is sent (pgoutput.c pgoutput_truncate), i.e. a statement that emptied
        # every leaf of the root.
        leaves = sql(per_target(plan, lambda t: lit(len(t.leaves))))
        truncates = (self.frame.where(F.col("_op") == "T")
                     .groupBy("_tgt", "_epoch", "commit_lsn", "lsn")
                     .agg(F.countDistinct("schema", "table").alias("_n"), F.min("seq").alias("seq"),
                          F.first("xid").alias("xid"),
                          F.max("truncate_restart_identity").alias("truncate_restart_identity"))
                     .where(F.col("_n") == leaves)
                     .select("_tgt", "commit_lsn", "seq", "xid", "truncate_restart_identity",
                             F.lit("T").alias("_op"), F.lit(None).cast("array<string>").alias("_key"),
                             F.lit(None).cast("array<string>").alias("_vals"),
                             F.lit(None).cast("string").alias("_fl"), F.lit(True).alias("_barrier")))
        ops = kept.select("_tgt", "commit_lsn", "seq", "xid", "truncate_restart_identity", "_op", "_key", "_vals",
                          "_fl", "_barrier").unionByName(truncates)
        with_barriers = self.facts().barrier_targets if barrier_targets is None else list(barrier_targets)
        with_barriers = sorted(set(with_barriers) | set(exact))
        if with_barriers:
            order = (Window.partitionBy("_tgt").orderBy("commit_lsn", "seq")
                     .rowsBetween(Window.unboundedPreceding, Window.currentRow))
            barrier = F.col("_barrier").cast("int")
            if exact:  # every change cuts: its phase is the number of changes before it
                barrier = F.when(F.col("_tgt").isin(list(exact)), F.lit(1)).otherwise(barrier)
            cut = (ops.where(F.col("_tgt").isin(with_barriers))
                   .withColumn("_phase", (F.sum(barrier).over(order) - barrier).cast("int")))
            ops = cut.unionByName(ops.where(~F.col("_tgt").isin(with_barriers)).withColumn("_phase", F.lit(0)))
        else:
            ops = ops.withColumn("_phase", F.lit(0))
        ncols = sql(per_target(plan, lambda t: lit(len(t.columns))))
        keyed = (ops.where(~F.col("_barrier"))
                 .groupBy("_tgt", "_phase", "_key")
                 .agg(F.sort_array(F.collect_list(F.struct("commit_lsn", "seq", "_op", "xid", "_vals", "_fl")))
                      .alias("ops"),
                      *(F.count_if(F.col("_op") == op).alias(name)
                        for op, name in (("I", "n_insert"), ("U", "n_update"), ("D", "n_delete"))),
                      F.min("commit_lsn").alias("_first_lsn"), F.max("commit_lsn").alias("_last_lsn")))
        keyed = keyed.withColumn("_n", ncols)
        # Each side's outcome is computed once per key as a struct column, then taken apart: extracting
        # the fields straight from the expression would make Spark evaluate it (a fold) once per field.
        # Whenever both outcomes leave a row they agree on every value either one reads (their flags may
        # differ, 1 against 2), so the values are staged once and rendered as JSON once: a single
        # change's as they are, a fold's from the outcome that leaves a row. Why: an INSERT sets every
        # cell of both the same; an UPDATE that finds a row overwrites the cells it carries (flag 0) and
        # keeps the others; an UPDATE that finds none (upsert) starts a row from the cells it carries; a
        # DELETE leaves no row on either side. So from the first change on, a flag-0 cell is the same on
        # every side that has a row.
        outcomes = keyed.select(
            "_tgt", "_phase", "_key", "n_insert", "n_update", "n_delete",
            # The key's first operation (which conflict a row found by it meets: subscriber/origin_conflicts.py) and,
            # when every change of the key is one remote transaction's, that transaction (named by a conflict).
            F.col("ops")[0]["_op"].alias("_first_op"),
            F.when(F.col("_first_lsn") == F.col("_last_lsn"), F.col("_first_lsn")).alias("_one_lsn"),
            F.when(F.col("_first_lsn") == F.col("_last_lsn"), F.col("ops")[0]["xid"]).alias("_one_xid"),
            *(F.when(F.size("ops") == 1, sql(single(existed, plan.policy)))
              .otherwise(sql(folded(existed, plan.policy))).alias(f"_{side}")
              for side, existed in (("p", True), ("a", False))),
            sql(single_vals()).alias("_single_vals"))
        keys = outcomes.select(
            F.lit(token).alias("token"), F.col("_tgt").alias("target"), F.col("_phase").alias("phase"),
            F.lit("K").alias("row_kind"), F.col("_first_op").alias("op"), F.to_json("_key").alias("key"),
            F.col("_one_lsn").alias("commit_lsn"), F.col("_one_xid").alias("xid"),
            F.col("n_insert").cast("long"), F.col("n_update").cast("long"), F.col("n_delete").cast("long"),
            F.to_json(F.coalesce("_single_vals", F.when(F.col("_p.present"), F.col("_p.vals"))
                                 .otherwise(F.col("_a.vals")))).alias("vals"),
            *(F.col(f"_{side}")[name].alias(f"{side}_{name}") for side in ("p", "a") for name in OUTCOME_FIELDS))
        barriers = ops.where("_barrier").select(
            F.lit(token).alias("token"), F.col("_tgt").alias("target"), F.col("_phase").alias("phase"),
            F.lit("B").alias("row_kind"), F.col("_op").alias("op"), F.to_json("_key").alias("key"),
            "commit_lsn", "xid", F.col("truncate_restart_identity").alias("restart_identity"),
            F.to_json("_vals").alias("vals"),
            # In a single UPDATE a column the change does not carry keeps the subscriber's value (flag 2).
            F.translate("_fl", "1", "2").alias("p_flags"))
        staged = keys.unionByName(barriers, allowMissingColumns=True)
        return staged.select(*(F.col(c.name).cast(c.spark) for c in STAGE_COLUMNS))


@contextlib.contextmanager
def _sql_settings(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in ``spark``'s session for the block, then put back as they were (the session
    serves the job's next batch and, through Spark Connect, its next run)."""
    previous: dict[str, str | None] = {key: spark.conf.get(key) for key in settings}
    try:
        for key, value in settings.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def decide(spark: SparkSession, paths: list[str], plan: ApplyPlan, changes: Sequence[int] | None = None
           ) -> DecidedBatch:
    """Read the segments (``changes``: the log's count of each) and judge every change of the subscribed tables
    (checkpointed locally on first use)."""
    return decide_frame(segments_frame(spark, paths, changes), plan)


def decide_frame(raw: DataFrame, plan: ApplyPlan) -> DecidedBatch:
    """Judge every change of ``raw`` (rows of the change log's schema) for the subscribed tables (spark/judge.py)."""
    # The checkpoint is also a barrier for the optimiser: without it, the stage's projections are
    # collapsed into the judging ones and Spark generates their code with every judging expression
    # inlined again for each use (a random 500-change batch ran the JVM out of heap generating it).
    return DecidedBatch(judged_frame(raw, plan).localCheckpoint(eager=False), plan)


def write_stage(frame: DataFrame, conninfo: dict[str, str]) -> int:
    """COPY the staged rows into ``rowfilter.apply_stage`` from the executors; returns the rows written.

    Arrow batches go to a Python task that streams them as CSV into ``COPY … FROM STDIN``
    (subscriber/apply_stage.py ``copy_stage``): one subscriber transaction per task; reruns are told apart by token.
    A small batch's rows, collected to the driver (:meth:`DecidedBatch.collected`), are COPYed from
    there by subscriber/apply_stage.py ``copy_stage_rows`` instead: no Python worker starts for them (on a Spark Connect
    server a new client's workers cost seconds before their first row).
    """
    columns = frame.columns
    written = frame.mapInArrow(partial(copy_stage, conninfo, columns), "rows long")
    return int(written.agg(F.sum("rows")).collect()[0][0] or 0)
