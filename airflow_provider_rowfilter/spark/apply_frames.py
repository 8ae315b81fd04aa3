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

Judging and reducing run in the JVM as projections Spark compiles whole (docs/apply.md, "Speed"):
the values are realigned once to the batch's columns so each read is positional, each filter is
evaluated once per row, and the judged batch is kept with ``localCheckpoint`` (rows as they are,
not re-encoded into the columnar cache). Only the staging write passes rows to Python, as Arrow.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from sqlglot import exp

from airflow_provider_rowfilter.core.apply_plan import (
    ApplyPlan,
    BatchFacts,
    EpochRules,
    TargetPlan,
    case_over,
    filter_expression,
    read_facts,
)
from airflow_provider_rowfilter.core.update_decision import UPDATE_DECISION_TABLE, ChangeKind
from airflow_provider_rowfilter.spark.log_reader import read_segments
from airflow_provider_rowfilter.spark.settings import SMALL_BATCH_SQL_SETTINGS
from airflow_provider_rowfilter.subscriber.apply_stage import OUTCOME_FIELDS, STAGE_COLUMNS, copy_stage

# What a change is applied as: I, U, D, T; or dropped: x filtered out, u operation not published.
_OP = {ChangeKind.INSERT: "I", ChangeKind.UPDATE: "U", ChangeKind.DELETE: "D", None: "x"}


def _text(e: exp.Expr, alias: str | None = None) -> str:
    """Spark SQL text of ``e`` (``AS alias``), for ``selectExpr``: one Py4J call per projection, not per node."""
    return (exp.alias_(e, alias) if alias else e).sql(dialect="spark", identify=True)


def _sql(e: exp.Expr) -> Column:
    return F.expr(_text(e))


def _fn(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


def _col(name: str) -> exp.Expr:
    return exp.column(name)


def _lit(value: object) -> exp.Expr:
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    return exp.Literal.string(str(value))


def _is(target: TargetPlan, epoch: int | None = None) -> exp.Expr:
    cond: exp.Expr = exp.EQ(this=_col("_tgt"), expression=_lit(target.index))
    if epoch is not None:
        cond = exp.and_(cond, exp.EQ(this=_col("_epoch"), expression=_lit(epoch)))
    return cond


def _per_rules(plan: ApplyPlan, value, default: exp.Expr) -> exp.Expr:
    """CASE over (table, epoch): ``value(target, rules)`` where the table is subscribed in that epoch."""
    return case_over(
        ((_is(t, e), value(t, rules)) for t in plan.targets for e, rules in enumerate(t.rules) if rules is not None),
        default)


def _published(plan: ApplyPlan, action: str) -> exp.Expr:
    return _per_rules(plan, lambda t, r: _lit(action in r.actions), _lit(False))


class BatchColumns:
    """Every column the batch reads (the targets' columns and keys, the filters' columns), by position.

    Each change's values are realigned once to this list (``_nv``, ``_ov``, ``_um``; ``_p`` holds where
    each sat in the change's own list, 0 when the change lacks it), so every later read is a positional
    ``element_at`` that Spark compiles, not a lookup by name per read.
    """

    def __init__(self, plan: ApplyPlan) -> None:
        names: dict[str, None] = {}
        for t in plan.targets:
            names.update(dict.fromkeys((*t.columns, *t.key)))
            for rules in t.rules:
                if rules is not None:
                    names.update(dict.fromkeys(rules.column_types))
        self.names = tuple(names)
        self.position = {n: i for i, n in enumerate(self.names)}

    # element_at, not get/[]: Spark's optimizer inlines an array into every get() of it, which would
    # repeat the realignment (and the filters) in every expression that reads a value.
    def read(self, values: str, name: str) -> exp.Expr:
        return _fn("element_at", _col(values), _lit(self.position[name] + 1))


def evaluated_filter(rules: EpochRules, action: str, names: BatchColumns, values: str) -> exp.Expr | None:
    """The action's effective filter (ORed publications) on one side of the change, as the apply evaluates it
    (``None``: unfiltered). tests/core/filters/test_row_filter_differential.py holds this against PostgreSQL."""
    tree = rules.filters.get(action)
    return None if tree is None else filter_expression(tree, rules.column_types, lambda n: names.read(values, n))


def _matches(plan: ApplyPlan, names: BatchColumns, action: str, values: str) -> exp.Expr:
    """The action's effective filter on one side of the change; NULL counts as no match."""
    def one(target: TargetPlan, rules: EpochRules) -> exp.Expr:
        matched = evaluated_filter(rules, action, names, values)
        return _lit(True) if matched is None else exp.func("coalesce", matched, _lit(False))
    return _per_rules(plan, one, _lit(False))


# The judged booleans of a change, each evaluated once per row (decide's third projection): whether
# each action is published, and whether the action's filter matches one side of the change.
_PUBLISHED = {"_pi": "insert", "_pu": "update", "_pd": "delete", "_pt": "truncate"}
_MATCHED = {"_fi": ("insert", "_nv"), "_fun": ("update", "_nv"), "_fuo": ("update", "_ov"), "_fd": ("delete", "_ov")}


def _decision() -> exp.Expr:
    """What each change is applied as (``_op``), from the judged booleans."""
    new_u, old_u = _col("_fun"), _col("_fuo")
    transform = exp.Case()
    for (old, new), kind in UPDATE_DECISION_TABLE.items():
        transform = transform.when(
            exp.and_(old_u.copy() if old else exp.not_(old_u.copy()), new_u.copy() if new else exp.not_(new_u.copy())),
            _lit(_OP[kind]))
    update = exp.If(this=exp.Is(this=_col("old_kind"), expression=exp.Null()),
                    true=exp.If(this=new_u.copy(), true=_lit("U"), false=_lit("x")), false=transform)

    def gated(published: str, decided: exp.Expr) -> exp.Expr:
        return exp.If(this=_col(published), true=decided, false=_lit("u"))

    kind_column = _col("kind")
    return (exp.Case()
            .when(exp.EQ(this=kind_column, expression=_lit("insert")),
                  gated("_pi", exp.If(this=_col("_fi"), true=_lit("I"), false=_lit("x"))))
            .when(exp.EQ(this=kind_column, expression=_lit("update")), gated("_pu", update))
            .when(exp.EQ(this=kind_column, expression=_lit("delete")),
                  gated("_pd", exp.If(this=_col("_fd"), true=_lit("D"), false=_lit("x"))))
            .when(exp.EQ(this=kind_column, expression=_lit("truncate")), gated("_pt", _lit("T")))
            .else_(_lit("u")))


def _per_target(plan: ApplyPlan, build) -> exp.Expr:
    """``CASE WHEN _tgt = i THEN build(target) … END`` (NULL for no target)."""
    return case_over((_is(t), build(t)) for t in plan.targets)


def _flags(plan: ApplyPlan, names: BatchColumns) -> exp.Expr:
    """One character per subscriber column: 0 the change carries it, 1 it does not (see subscriber/apply_target.py)."""
    def one(target: TargetPlan, rules: EpochRules) -> exp.Expr:
        cells = []
        for c in target.columns:
            carried = (exp.GT(this=names.read("_p", c), expression=_lit(0)) if rules.publishes_column(c)
                       else _lit(False))
            unchanged = exp.and_(exp.EQ(this=_col("_op"), expression=_lit("U")),
                                 exp.func("coalesce", names.read("_um", c), _lit(False)))
            cells.append(exp.If(this=exp.or_(exp.not_(carried), unchanged), true=_lit("1"), false=_lit("0")))
        return _fn("concat", *cells) if cells else _lit("")
    return _per_rules(plan, one, exp.Null())


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
        leaves = _sql(_per_target(plan, lambda t: _lit(len(t.leaves))))
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
        ncols = _sql(_per_target(plan, lambda t: _lit(len(t.columns))))
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
            *(F.when(F.size("ops") == 1, _sql(_single(existed, plan.policy)))
              .otherwise(_sql(_folded(existed, plan.policy))).alias(f"_{side}")
              for side, existed in (("p", True), ("a", False))),
            _sql(_single_vals()).alias("_single_vals"))
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


def _null(type_: str) -> exp.Expr:
    return exp.cast(exp.Null(), type_)


def _long(value: int) -> exp.Expr:
    return exp.cast(_lit(value), "bigint")


def _get(of: exp.Expr, field: str) -> exp.Expr:
    """``of.field``: a field of a struct (a lambda variable's, or an array element's)."""
    return exp.Dot(this=of, expression=exp.to_identifier(field))


def _var(name: str) -> exp.Expr:
    """A lambda variable."""
    return exp.column(name)


def _lambda(body: exp.Expr, *variables: str) -> exp.Expr:
    return exp.Lambda(this=body, expressions=[exp.to_identifier(v) for v in variables])


def _struct(**fields: exp.Expr) -> exp.Expr:
    return _fn("named_struct", *(e for name, value in fields.items() for e in (_lit(name), value)))


def _outcome(present: exp.Expr, vals: exp.Expr | None = None, flags: exp.Expr | None = None,
             clsn: exp.Expr | None = None, cxid: exp.Expr | None = None,
             mu: exp.Expr | None = None, md: exp.Expr | None = None) -> exp.Expr:
    """A key's net effect from one start: subscriber/apply_stage.py ``OUTCOME_FIELDS``, and the values."""
    return _struct(present=present, vals=_null("array<string>") if vals is None else vals,
                   flags=_null("string") if flags is None else flags,
                   conflict_lsn=_null("bigint") if clsn is None else clsn,
                   conflict_xid=_null("bigint") if cxid is None else cxid,
                   missing_update=_long(0) if mu is None else mu, missing_delete=_long(0) if md is None else md)


def _by_op(op: exp.Expr, insert: exp.Expr, update: exp.Expr,
           delete: exp.Expr) -> exp.Expr:
    """``CASE op WHEN 'I' THEN insert WHEN 'U' THEN update ELSE delete END``."""
    return exp.Case(this=op, ifs=[exp.If(this=_lit("I"), true=insert), exp.If(this=_lit("U"), true=update)],
                    default=delete)


def _single(existed: bool, policy: str) -> exp.Expr:
    """The net effect of a key's only change (most keys of a batch), without a fold.

    The same as :func:`_folded` on a one-element list, but without the values: they are the change's
    own, staged once for both outcomes. A value whose flag is not 0 is never read.
    """
    o = exp.Bracket(this=_col("ops"), expressions=[_lit(0)])
    conflict = existed and policy == "error"
    insert = _outcome(_lit(True), flags=_get(o, "_fl"), clsn=_get(o, "commit_lsn") if conflict else None,
                      cxid=_get(o, "xid") if conflict else None)
    if existed:
        update = _outcome(_lit(True), flags=_fn("translate", _get(o, "_fl"), _lit("1"), _lit("2")))
    elif policy == "upsert":
        update = _outcome(_lit(True), flags=_get(o, "_fl"))
    else:
        update = _outcome(_lit(False), mu=_long(1))
    delete = _outcome(_lit(False), md=_long(0 if existed else 1))
    return _by_op(_get(o, "_op"), insert, update, delete)


def _folded(existed: bool, policy: str) -> exp.Expr:
    """The net effect of a key's changes, in commit order, from a start where the key existed or not.

    State: present, cells (value and flag per column; 2 = the subscriber's current value), the first
    conflict (commit_lsn, xid), and the UPDATEs/DELETEs that found no row (skipped and counted, as
    worker.c apply_handle_update_internal and apply_handle_delete_internal report them).
    """
    s, o = _var("s"), _var("o")

    def state(present: exp.Expr, cells: exp.Expr, *, clsn: exp.Expr | None = None,
              cxid: exp.Expr | None = None, mu: exp.Expr | None = None) -> exp.Expr:
        return _struct(present=present, cells=cells, clsn=_get(s, "clsn") if clsn is None else clsn,
                       cxid=_get(s, "cxid") if cxid is None else cxid, mu=_get(s, "mu") if mu is None else mu,
                       md=_get(s, "md"))

    def cell(value: exp.Expr, flag: exp.Expr) -> exp.Expr:
        return _struct(v=value, f=flag)

    # the change's cells: its values, each with its flag as a number
    cells = _fn("zip_with", _get(o, "_vals"), _fn("split", _get(o, "_fl"), _lit("")),
                _lambda(cell(_var("v"), exp.cast(_var("f"), "int")), "v", "f"))
    carried = exp.EQ(this=_get(_var("c"), "f"), expression=_lit(0))
    if policy == "upsert":  # a new row from the cells the UPDATE carries, the others their default
        missed_update = state(_lit(True), _fn("transform", cells.copy(), _lambda(
            exp.If(this=carried.copy(), true=_var("c"), false=cell(_null("string"), _lit(1))), "c")))
    else:
        missed_update = state(_lit(False), _get(s, "cells"),
                              mu=exp.Add(this=_get(s, "mu"), expression=_long(1)))
    conflict = (exp.and_(_get(s, "present"), exp.Is(this=_get(s, "clsn"), expression=exp.Null()))
                if policy == "error" else _lit(False))
    insert = state(_lit(True), cells.copy(), clsn=exp.If(this=conflict, true=_get(o, "commit_lsn"), false=_get(s, "clsn")),
                   cxid=exp.If(this=conflict.copy(), true=_get(o, "xid"), false=_get(s, "cxid")))
    update = exp.If(this=_get(s, "present"), true=state(_lit(True), _fn("zip_with", _get(s, "cells"), cells.copy(), _lambda(
        exp.If(this=exp.EQ(this=_get(_var("b"), "f"), expression=_lit(0)), true=_var("b"), false=_var("a")), "a", "b"))),
        false=missed_update)
    gone = _struct(present=_lit(False), cells=_get(s, "cells"), clsn=_get(s, "clsn"), cxid=_get(s, "cxid"),
                   mu=_get(s, "mu"), md=_get(s, "md"))
    missed_delete = _struct(present=_lit(False), cells=_get(s, "cells"), clsn=_get(s, "clsn"), cxid=_get(s, "cxid"),
                            mu=_get(s, "mu"), md=exp.Add(this=_get(s, "md"), expression=_long(1)))
    delete = exp.If(this=_get(s, "present"), true=gone, false=missed_delete)
    start = _struct(present=_lit(existed), cells=_fn("array_repeat", cell(_null("string"), _lit(2)), _col("_n")),
                    clsn=_null("bigint"), cxid=_null("bigint"), mu=_long(0), md=_long(0))
    finish = _outcome(_get(s, "present"), _fn("transform", _get(s, "cells"), _lambda(_get(_var("c"), "v"), "c")),
                      _fn("array_join", _fn("transform", _get(s, "cells"),
                                            _lambda(exp.cast(_get(_var("c"), "f"), "string"), "c")), _lit("")),
                      _get(s, "clsn"), _get(s, "cxid"), _get(s, "mu"), _get(s, "md"))
    return _fn("aggregate", _col("ops"), start, _lambda(_by_op(_get(o, "_op"), insert, update, delete), "s", "o"),
               _lambda(finish, "s"))


def decide(spark: SparkSession, paths: list[str], plan: ApplyPlan) -> DecidedBatch:
    """Read the segments and judge every change of the subscribed tables (checkpointed locally on first use)."""
    return decide_frame(read_segments(spark, paths), plan)


def decide_frame(raw: DataFrame, plan: ApplyPlan) -> DecidedBatch:
    """Judge every change of ``raw`` (rows of the change log's schema) for the subscribed tables.

    Built from projections Spark compiles whole (no maps, no lambdas): route, realign the values to
    the batch's columns, judge (each filter once per row), decide, then key, values and flags. Each
    projection is one ``selectExpr`` of SQL text generated from sqlglot trees: a few Py4J calls per
    batch rather than one per expression node (thousands, seconds in a cold JVM).
    """
    # Route each leaf to its target by a broadcast join with a table built in the JVM (not from Python
    # rows, which would start Python workers to read them back). The positions stay out of the big
    # judging projection: Spark inlines a number literal into its generated code, so a literal that
    # moves every batch would make Spark compile and the JIT warm up that code again each time.
    routes = [_fn("named_struct", _lit("_leaf_schema"), _lit(leaf.schema), _lit("_leaf_table"), _lit(leaf.name),
                  _lit("_tgt"), _lit(t.index), _lit("_position"), exp.cast(_lit(t.position), "bigint"))
              for t in plan.targets for leaf in t.leaves]
    table = raw.sparkSession.range(1).selectExpr(_text(_fn("inline", exp.Array(expressions=routes))))
    frame = (raw.join(F.broadcast(table), (raw["schema"] == table["_leaf_schema"])
                      & (raw["table"] == table["_leaf_table"]))
             .where(F.col("commit_lsn") >= F.col("_position")))
    epoch: exp.Expr = _lit(0)
    for i, start in enumerate(plan.epochs[1:], start=1):
        epoch = exp.If(this=exp.GTE(this=_col("commit_lsn"), expression=_lit(start)), true=_lit(i), false=epoch)
    keyless = [t for t in plan.targets if not t.key]
    base = ["commit_lsn", "seq", "lsn", "xid", "kind", "schema", "table", "column_names", "old_kind",
            "truncate_restart_identity", *(["replica_identity"] if keyless else []), "_tgt", "_epoch"]
    kept = [_text(_col(c)) for c in base]
    names = BatchColumns(plan)
    positions = range(1, len(names.names) + 1)
    # 1. where each of the batch's columns sits in the change's column list (0: the change lacks it)
    frame = frame.selectExpr(
        *kept[:-1], "new_values", "new_unchanged", "old_values", _text(epoch, "_epoch"),
        _text(exp.Array(expressions=[exp.cast(_fn("array_position", _col("column_names"), _lit(n)), "int")
                                     for n in names.names]), "_p"))

    def realigned(build: Callable[[exp.Expr], exp.Expr]) -> exp.Expr:
        cells = []
        for i in positions:
            p = _fn("element_at", _col("_p"), _lit(i))
            cells.append(exp.If(this=exp.GT(this=p, expression=_lit(0)), true=build(p), false=exp.Null()))
        return exp.Array(expressions=cells)

    def at(values: str, p: exp.Expr) -> exp.Expr:
        return _fn("try_element_at", _col(values), p.copy())

    is_full = exp.EQ(this=_col("old_kind"), expression=_lit("O"))
    has_new = exp.Not(this=exp.Is(this=_col("new_values"), expression=exp.Null()))
    has_old = exp.Not(this=exp.Is(this=_col("old_values"), expression=exp.Null()))
    # 2. the values realigned; an unchanged TOASTed value is taken from the old full row when there is
    # one (pgoutput.c pgoutput_row_filter)
    new_values = realigned(lambda p: exp.If(this=exp.and_(is_full.copy(), at("new_unchanged", p)),
                                            true=at("old_values", p), false=at("new_values", p)))
    frame = frame.selectExpr(
        *kept,
        _text(exp.If(this=has_new, true=new_values, false=exp.Null()), "_nv"),
        _text(exp.If(this=exp.and_(has_new.copy(), exp.func("coalesce", exp.NEQ(this=_col("old_kind"),
                                                                                 expression=_lit("O")), _lit(True))),
                     true=realigned(lambda p: at("new_unchanged", p)), false=exp.Null()), "_um"),
        _text(exp.If(this=has_old, true=realigned(lambda p: at("old_values", p)), false=exp.Null()), "_ov"),
        "_p")
    # 3. judge: each filter and publish flag once per row
    judged = [*(_text(_published(plan, action), name) for name, action in _PUBLISHED.items()),
              *(_text(_matches(plan, names, action, side), name) for name, (action, side) in _MATCHED.items())]
    frame = frame.selectExpr(*kept, "_nv", "_um", "_ov", "_p", *judged)
    # 4. decide
    decision = _decision()
    if plan.skip_lsn is not None:  # ALTER SUBSCRIPTION … SKIP: the whole transaction is dropped
        decision = exp.If(this=exp.EQ(this=_col("commit_lsn"), expression=_lit(plan.skip_lsn)), true=_lit("s"),
                          false=decision)

    def key(values: str) -> exp.Expr:
        return _per_target(plan, lambda t: exp.Array(expressions=[names.read(values, k) for k in t.key])
                           if t.key else _identity())
    frame = frame.selectExpr(*kept, "_nv", "_um", "_ov", "_p", _text(decision, "_op"), _text(key("_nv"), "_newkey"),
                             _text(key("_ov"), "_oldkey"))
    # 5. what is staged: the key the change is found by, its values and flags, whether it is a barrier
    op = _col("_op")
    dml = exp.In(this=op, expressions=[_lit("I"), _lit("U")])
    has_old_row = exp.Not(this=exp.Is(this=_col("_ov"), expression=exp.Null()))  # has_old, on what step 2 kept
    found_by: exp.Expr = (exp.Case()
                .when(exp.EQ(this=op.copy(), expression=_lit("I")), _col("_newkey"))
                .when(exp.EQ(this=op.copy(), expression=_lit("D")), _col("_oldkey"))
                .when(exp.EQ(this=op.copy(), expression=_lit("U")),
                      exp.If(this=has_old_row.copy(), true=_col("_oldkey"), false=_col("_newkey"))))
    values = _per_target(plan, lambda t: exp.Array(expressions=[names.read("_nv", c) for c in t.columns]))
    key_changed = exp.and_(exp.EQ(this=op.copy(), expression=_lit("U")), has_old_row.copy(),
                           exp.not_(exp.NullSafeEQ(this=_col("_oldkey"), expression=_col("_newkey"))))
    staged_op: exp.Expr = op.copy()
    barrier = key_changed
    if keyless:
        # A table without a key (relation.c logicalrep_rel_mark_updatable): its INSERTs are found by
        # their own identity (_identity, one row each); an UPDATE or DELETE needs the publisher's
        # REPLICA IDENTITY FULL ('n' otherwise: the batch stops, worker.c check_relation_updatable),
        # and then is found by its old row on every column, one statement each (a barrier).
        unkeyed = exp.and_(exp.In(this=_col("_tgt"), expressions=[_lit(t.index) for t in keyless]),
                           exp.In(this=op.copy(), expressions=[_lit("U"), _lit("D")]))
        full = exp.EQ(this=_col("replica_identity"), expression=_lit("f"))
        staged_op = exp.If(this=exp.and_(unkeyed.copy(), exp.not_(full.copy())), true=_lit("n"), false=op.copy())
        old_row = _per_target(plan, lambda t: exp.Array(expressions=[names.read("_ov", c) for c in t.columns]))
        found_by = exp.If(this=unkeyed.copy(), true=old_row, false=found_by)
        barrier = exp.or_(unkeyed.copy(), key_changed)
    frame = frame.selectExpr(
        "_tgt", "_epoch", "commit_lsn", "seq", "lsn", "xid", "kind", "schema", "`table`", "column_names",
        "truncate_restart_identity", _text(staged_op, "_op"), _text(found_by, "_key"),
        _text(exp.If(this=dml, true=values, false=exp.Null()), "_vals"),
        _text(exp.If(this=dml.copy(), true=_flags(plan, names), false=exp.Null()), "_fl"),
        _text(barrier, "_barrier"))
    # The checkpoint is also a barrier for the optimiser: without it, the stage's projections are
    # collapsed into the judging ones and Spark generates their code with every judging expression
    # inlined again for each use (a random 500-change batch ran the JVM out of heap generating it).
    return DecidedBatch(frame.localCheckpoint(eager=False), plan)


def _single_vals() -> exp.Expr:
    """A single change's values, staged as they are (``NULL`` for a DELETE's, or for a fold)."""
    o = exp.Bracket(this=_col("ops"), expressions=[_lit(0)])
    return exp.If(this=exp.and_(exp.EQ(this=_fn("size", _col("ops")), expression=_lit(1)),
                                exp.NEQ(this=_get(o, "_op"), expression=_lit("D"))),
                  true=_get(o.copy(), "_vals"), false=exp.Null())


def _identity() -> exp.Expr:
    """A change's own identity, ``[commit_lsn, seq]``: the "key" of a change to a table without one."""
    return exp.Array(expressions=[exp.cast(_col("commit_lsn"), "string"), exp.cast(_col("seq"), "string")])


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
