"""The apply batch on Spark: read the change log, judge every change as pgoutput would, reduce per key.

1. **Route**: each change's leaf goes to its subscriber table (the root under
   ``publish_via_partition_root``); only changes at or after the table's position count, and none of
   the transaction being skipped.
2. **Judge** (pgoutput_change, pgoutput_row_filter): the operation must be published; INSERT is
   filtered on the new row, DELETE on the old, UPDATE on the new alone without an old row and on
   both otherwise, then turned into INSERT or DELETE by the decision table (R5.4). Unchanged TOASTed
   values are taken from an old full row first (R5.5). TRUNCATE ignores filters (R8).
3. **Project** each kept change on the subscriber's columns: value, "not carried" (a column outside
   the column list, one the publisher's table lacks, or an unchanged TOASTed value) — see
   pg/apply_target.py for what each flag means when written.
4. **Reduce**: changes between two *barriers* (TRUNCATE, an UPDATE that changes the key) are grouped
   by table, phase and key and folded in commit order into the key's net effect, once as if the
   key existed before the batch and once as if not; the subscriber chooses. A key's only change
   (most keys of a batch) is turned into its effect by an expression; only keys with several
   changes go through the fold, a higher-order function Spark interprets.
5. **Stage**: the result is COPYed into ``rowfilter.apply_stage`` from the executors.

Judging and reducing run in the JVM as projections Spark compiles whole (docs/apply.md, "Speed"):
the values are realigned once to the batch's columns so each read is positional, each filter is
evaluated once per row, and the judged batch is kept with ``localCheckpoint`` (rows as they are,
not re-encoded into the columnar cache). Only the staging write passes rows to Python, as Arrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from sqlglot import exp

from airflow_provider_rowfilter.core.apply_plan import (
    ApplyPlan,
    EpochRules,
    TargetPlan,
    case_over,
    filter_expression,
)
from airflow_provider_rowfilter.core.update_decision import UPDATE_DECISION_TABLE, ChangeKind
from airflow_provider_rowfilter.pg.apply_target import copy_stage

# What a change is applied as: I, U, D, T; or dropped: x filtered out, u operation not published.
_OP = {ChangeKind.INSERT: "I", ChangeKind.UPDATE: "U", ChangeKind.DELETE: "D", None: "x"}
STAGE_TABLE = "rowfilter.apply_stage"


def _sql(e: exp.Expression) -> Column:
    return F.expr(e.sql(dialect="spark"))


def _col(name: str) -> exp.Expression:
    return exp.column(name)


def _lit(value: object) -> exp.Expression:
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    return exp.Literal.string(str(value))


def _is(target: TargetPlan, epoch: int | None = None) -> exp.Expression:
    cond = exp.EQ(this=_col("_tgt"), expression=_lit(target.index))
    if epoch is not None:
        cond = exp.and_(cond, exp.EQ(this=_col("_epoch"), expression=_lit(epoch)))
    return cond


def _per_rules(plan: ApplyPlan, value, default: exp.Expression) -> exp.Expression:
    """CASE over (table, epoch): ``value(target, rules)`` where the table is subscribed in that epoch."""
    return case_over(
        ((_is(t, e), value(t, rules)) for t in plan.targets for e, rules in enumerate(t.rules) if rules is not None),
        default)


def _published(plan: ApplyPlan, action: str) -> exp.Expression:
    return _per_rules(plan, lambda t, r: _lit(action in r.actions), _lit(False))


class _Names:
    """Every column the batch reads (the targets' columns and keys, the filters' columns), by position.

    Each change's values are realigned once to this list (``_nv``, ``_ov``, ``_um``, ``_cv``), so
    every later read is a positional ``element_at`` that Spark compiles, not a lookup by name per read.
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
    def read(self, values: str, name: str) -> exp.Expression:
        return exp.Anonymous(this="element_at", expressions=[_col(values), _lit(self.position[name] + 1)])

    def column(self, values: str, name: str) -> Column:
        return F.element_at(F.col(values), F.lit(self.position[name] + 1))


def _matches(plan: ApplyPlan, names: _Names, action: str, values: str) -> exp.Expression:
    """The action's effective filter (ORed publications; NULL counts as no match) on one side of the change."""
    def one(target: TargetPlan, rules: EpochRules) -> exp.Expression:
        text = rules.filters.get(action)
        if text is None:
            return _lit(True)
        return exp.func("coalesce", filter_expression(text, rules.column_types, lambda n: names.read(values, n)),
                        _lit(False))
    return _per_rules(plan, one, _lit(False))


# The judged booleans of a change, each evaluated once per row (decide's third projection).
_JUDGED = {"_pi": ("published", "insert"), "_pu": ("published", "update"), "_pd": ("published", "delete"),
           "_pt": ("published", "truncate"), "_fi": ("insert", "_nv"), "_fun": ("update", "_nv"),
           "_fuo": ("update", "_ov"), "_fd": ("delete", "_ov")}


def _decision() -> exp.Expression:
    """What each change is applied as (``_op``), from the judged booleans."""
    new_u, old_u = _col("_fun"), _col("_fuo")
    transform = exp.Case()
    for (old, new), kind in UPDATE_DECISION_TABLE.items():
        transform = transform.when(
            exp.and_(old_u.copy() if old else exp.not_(old_u.copy()), new_u.copy() if new else exp.not_(new_u.copy())),
            _lit(_OP[kind]))
    update = exp.If(this=exp.Is(this=_col("old_kind"), expression=exp.Null()),
                    true=exp.If(this=new_u.copy(), true=_lit("U"), false=_lit("x")), false=transform)

    def gated(published: str, decided: exp.Expression) -> exp.Expression:
        return exp.If(this=_col(published), true=decided, false=_lit("u"))

    kind = _col("kind")
    return (exp.Case()
            .when(exp.EQ(this=kind, expression=_lit("insert")),
                  gated("_pi", exp.If(this=_col("_fi"), true=_lit("I"), false=_lit("x"))))
            .when(exp.EQ(this=kind, expression=_lit("update")), gated("_pu", update))
            .when(exp.EQ(this=kind, expression=_lit("delete")),
                  gated("_pd", exp.If(this=_col("_fd"), true=_lit("D"), false=_lit("x"))))
            .when(exp.EQ(this=kind, expression=_lit("truncate")), gated("_pt", _lit("T")))
            .else_(_lit("u")))


def _array_per_target(plan: ApplyPlan, build) -> Column:
    """``CASE _tgt WHEN i THEN build(target) END`` with Column values."""
    result = None
    for t in plan.targets:
        cond = F.col("_tgt") == t.index
        result = F.when(cond, build(t)) if result is None else result.when(cond, build(t))
    return result if result is not None else F.lit(None)


def _flags(plan: ApplyPlan, names: _Names) -> Column:
    """One character per subscriber column: 0 the change carries it, 1 it does not (see pg/apply_target.py)."""
    result = None
    for t in plan.targets:
        for e, rules in enumerate(t.rules):
            if rules is None:
                continue
            cells = []
            for c in t.columns:
                carried = names.column("_cv", c) if rules.publishes_column(c) else F.lit(False)
                unchanged = (F.col("_op") == "U") & F.coalesce(names.column("_um", c), F.lit(False))
                cells.append(F.when(~carried | unchanged, F.lit("1")).otherwise(F.lit("0")))
            cond = (F.col("_tgt") == t.index) & (F.col("_epoch") == e)
            built = F.concat(*cells) if cells else F.lit("")
            result = F.when(cond, built) if result is None else result.when(cond, built)
    return result if result is not None else F.lit(None)


@dataclass
class BatchFacts:
    """What one aggregation over the judged changes says (a single Spark job)."""

    counts: dict[int, dict[str, int]]  # per target: filtered, unpublished, update_to_insert, update_to_delete, skipped
    column_sets: list[tuple[int, tuple[str, ...], int]]  # (target, published columns, first commit_lsn)
    barrier_targets: list[int]
    changes: int
    skipped: bool  # the batch holds the transaction being skipped


@dataclass
class DecidedBatch:
    """The judged changes of a batch (checkpointed: summarised and reduced from one evaluation)."""

    frame: DataFrame
    plan: ApplyPlan
    _facts: BatchFacts | None = None

    def release(self) -> None:
        """Drop the checkpointed rows now, rather than when the JVM's garbage collector finds them."""
        checkpointed = self.frame._jdf.queryExecution().analyzed()  # a LogicalRDD over the checkpoint
        if checkpointed.getClass().getSimpleName() == "LogicalRDD":
            checkpointed.rdd().unpersist(False)

    def facts(self) -> BatchFacts:
        if self._facts is not None:
            return self._facts
        layout = F.when(F.col("_op").isin("I", "U"), F.col("column_names"))
        rows = (self.frame.groupBy("_tgt", "_epoch", "kind", "_op", "_barrier", layout.alias("layout"))
                .agg(F.count(F.lit(1)).alias("n"), F.min("commit_lsn").alias("first")).collect())
        names = {"x": "filtered", "u": "unpublished", "s": "skipped"}
        by_index = {t.index: t for t in self.plan.targets}
        counts: dict[int, dict[str, int]] = {}
        layouts: dict[tuple[int, tuple[str, ...]], int] = {}
        barriers: set[int] = set()
        for r in rows:
            tgt, op, n = r["_tgt"], r["_op"], r["n"]
            c = counts.setdefault(tgt, {})
            name = names.get(op) or (("update_to_insert" if op == "I" else "update_to_delete")
                                     if r["kind"] == "update" and op in ("I", "D") else None)
            if name:
                c[name] = c.get(name, 0) + n
            if r["_barrier"] or op == "T":
                barriers.add(tgt)
            if r["layout"] is not None:
                rules = by_index[tgt].rules[r["_epoch"]]
                published = tuple(col for col in r["layout"] if rules is not None and rules.publishes_column(col))
                key = (tgt, published)
                layouts[key] = min(layouts.get(key, r["first"]), r["first"])
        self._facts = BatchFacts(
            counts=counts, column_sets=[(t, cols, first) for (t, cols), first in layouts.items()],
            barrier_targets=sorted(barriers), changes=sum(r["n"] for r in rows),
            skipped=any(r["_op"] == "s" for r in rows))
        return self._facts

    def staged(self, token: str) -> DataFrame:
        """The rows for ``rowfilter.apply_stage``: net effect per key ('K'), and the barriers ('B')."""
        plan = self.plan
        kept = self.frame.where(F.col("_op").isin("I", "U", "D"))
        # One TRUNCATE statement lists every leaf it emptied; under publish_via_partition_root only the
        # root's own TRUNCATE is sent (R8.2), i.e. a statement that emptied every leaf of the root.
        leaves = _array_per_target(plan, lambda t: F.lit(len(t.leaves)))
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
        with_barriers = self.facts().barrier_targets
        if with_barriers:
            order = (Window.partitionBy("_tgt").orderBy("commit_lsn", "seq")
                     .rowsBetween(Window.unboundedPreceding, Window.currentRow))
            barrier = F.col("_barrier").cast("int")
            cut = (ops.where(F.col("_tgt").isin(with_barriers))
                   .withColumn("_phase", (F.sum(barrier).over(order) - barrier).cast("int")))
            ops = cut.unionByName(ops.where(~F.col("_tgt").isin(with_barriers)).withColumn("_phase", F.lit(0)))
        else:
            ops = ops.withColumn("_phase", F.lit(0))
        ncols = _array_per_target(plan, lambda t: F.lit(len(t.columns)))
        keyed = (ops.where(~F.col("_barrier"))
                 .groupBy("_tgt", "_phase", "_key")
                 .agg(F.sort_array(F.collect_list(F.struct("commit_lsn", "seq", "_op", "xid", "_vals", "_fl")))
                      .alias("ops"),
                      *(F.count_if(F.col("_op") == op).alias(name)
                        for op, name in (("I", "n_insert"), ("U", "n_update"), ("D", "n_delete")))))
        keyed = keyed.withColumn("_n", ncols)
        outcome = []
        for side, existed in (("p", True), ("a", False)):
            s = F.when(F.size("ops") == 1, _single(existed, plan.policy)).otherwise(_folded(existed, plan.policy))
            outcome += [s[name].alias(f"{side}_{name}") for name in
                        ("present", "vals", "flags", "conflict_lsn", "conflict_xid", "missing_update",
                         "missing_delete")]
        keys = keyed.select(
            F.lit(token).alias("token"), F.col("_tgt").alias("target"), F.col("_phase").alias("phase"),
            F.lit("K").alias("row_kind"), F.lit(None).cast("string").alias("op"), F.to_json("_key").alias("key"),
            F.col("n_insert").cast("long"), F.col("n_update").cast("long"), F.col("n_delete").cast("long"), *outcome)
        barriers = ops.where("_barrier").select(
            F.lit(token).alias("token"), F.col("_tgt").alias("target"), F.col("_phase").alias("phase"),
            F.lit("B").alias("row_kind"), F.col("_op").alias("op"), F.to_json("_key").alias("key"),
            "commit_lsn", "xid", F.col("truncate_restart_identity").alias("restart_identity"),
            F.to_json("_vals").alias("p_vals"),
            # In a single UPDATE a column the change does not carry keeps the subscriber's value (flag 2).
            F.translate("_fl", "1", "2").alias("p_flags"))
        return keys.unionByName(barriers, allowMissingColumns=True)


_OUTCOME = ("named_struct('present', {present}, 'vals', {vals}, 'flags', {flags}, 'conflict_lsn', {clsn}, "
            "'conflict_xid', {cxid}, 'missing_update', {mu}, 'missing_delete', {md})")


def _outcome(present: str, vals: str = "CAST(NULL AS STRING)", flags: str = "CAST(NULL AS STRING)",
             clsn: str = "CAST(NULL AS BIGINT)", cxid: str = "CAST(NULL AS BIGINT)", mu: str = "0L",
             md: str = "0L") -> str:
    return _OUTCOME.format(present=present, vals=vals, flags=flags, clsn=clsn, cxid=cxid, mu=mu, md=md)


def _single(existed: bool, policy: str) -> Column:
    """The net effect of a key's only change (most keys of a batch), without a fold.

    The same as :func:`_folded` on a one-element list; a value whose flag is not 0 is never read.
    """
    o = "ops[0]"
    conflict = existed and policy == "error"
    insert = _outcome("true", f"to_json({o}._vals)", f"{o}._fl",
                      f"{o}.commit_lsn" if conflict else "CAST(NULL AS BIGINT)",
                      f"{o}.xid" if conflict else "CAST(NULL AS BIGINT)")
    if existed:
        update = _outcome("true", f"to_json({o}._vals)", f"translate({o}._fl, '1', '2')")
    elif policy == "upsert":
        update = _outcome("true", f"to_json({o}._vals)", f"{o}._fl")
    else:
        update = _outcome("false", mu="1L")
    delete = _outcome("false", md="0L" if existed else "1L")
    return F.expr(f"CASE {o}._op WHEN 'I' THEN {insert} WHEN 'U' THEN {update} ELSE {delete} END")


def _folded(existed: bool, policy: str) -> Column:
    """The net effect of a key's changes, in commit order, from a start where the key existed or not.

    State: present, cells (value and flag per column; 2 = the subscriber's current value), the first
    conflict (commit_lsn, xid), and the UPDATEs/DELETEs that found no row (R14.5: skipped, counted).
    """
    conflict = "s.present AND s.clsn IS NULL" if policy == "error" else "false"
    cells = "zip_with(o._vals, split(o._fl, ''), (v, f) -> named_struct('v', v, 'f', CAST(f AS INT)))"
    missed_update = (
        f"named_struct('present', true, 'cells', transform({cells}, c -> IF(c.f = 0, c, "
        "named_struct('v', CAST(NULL AS STRING), 'f', 1))), 'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu, 'md', s.md)"
        if policy == "upsert" else
        "named_struct('present', false, 'cells', s.cells, 'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu + 1L, 'md', s.md)")
    start = (f"named_struct('present', {'true' if existed else 'false'}, "
             "'cells', array_repeat(named_struct('v', CAST(NULL AS STRING), 'f', 2), _n), "
             "'clsn', CAST(NULL AS BIGINT), 'cxid', CAST(NULL AS BIGINT), 'mu', 0L, 'md', 0L)")
    fold = f"""aggregate(ops, {start}, (s, o) -> CASE o._op
        WHEN 'I' THEN named_struct('present', true, 'cells', {cells},
            'clsn', IF({conflict}, o.commit_lsn, s.clsn), 'cxid', IF({conflict}, o.xid, s.cxid), 'mu', s.mu, 'md', s.md)
        WHEN 'U' THEN IF(s.present,
            named_struct('present', true, 'cells', zip_with(s.cells, {cells}, (a, b) -> IF(b.f = 0, b, a)),
                         'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu, 'md', s.md),
            {missed_update})
        ELSE IF(s.present,
            named_struct('present', false, 'cells', s.cells, 'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu, 'md', s.md),
            named_struct('present', false, 'cells', s.cells, 'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu, 'md', s.md + 1L))
        END, s -> {_outcome("s.present", "to_json(transform(s.cells, c -> c.v))",
                            "array_join(transform(s.cells, c -> CAST(c.f AS STRING)), '')",
                            "s.clsn", "s.cxid", "s.mu", "s.md")})"""
    return F.expr(fold)


def decide(spark: SparkSession, paths: list[str], plan: ApplyPlan) -> DecidedBatch:
    """Read the segments and judge every change of the subscribed tables (checkpointed locally on first use).

    Built from projections Spark compiles whole (no maps, no lambdas): route, realign the values to
    the batch's columns, judge (each filter once per row), decide, then key, values and flags.
    """
    raw = spark.read.parquet(*paths)
    # Route each leaf to its target by a broadcast join with a table built in the JVM (not from Python
    # rows, which would start Python workers to read them back). The positions stay out of the big
    # judging projection: Spark inlines a number literal into its generated code, so a literal that
    # moves every batch would make Spark compile and the JIT warm up that code again each time.
    routes = [F.struct(F.lit(leaf.schema).alias("_leaf_schema"), F.lit(leaf.name).alias("_leaf_table"),
                       F.lit(t.index).alias("_tgt"), F.lit(t.position).cast("long").alias("_position"))
              for t in plan.targets for leaf in t.leaves]
    if not routes:
        routes = [F.struct(F.lit(None).cast("string").alias("_leaf_schema"),
                           F.lit(None).cast("string").alias("_leaf_table"),
                           F.lit(None).cast("int").alias("_tgt"), F.lit(None).cast("long").alias("_position"))]
    table = spark.range(1).select(F.inline(F.array(*routes)))
    frame = (raw.join(F.broadcast(table), (raw["schema"] == table["_leaf_schema"])
                      & (raw["table"] == table["_leaf_table"]))
             .where(F.col("commit_lsn") >= F.col("_position")))
    epoch = F.lit(0)
    for i, start in enumerate(plan.epochs[1:], start=1):
        epoch = F.when(F.col("commit_lsn") >= F.lit(start), F.lit(i)).otherwise(epoch)
    base = ["commit_lsn", "seq", "lsn", "xid", "kind", "schema", "table", "column_names", "old_kind",
            "truncate_restart_identity", "_tgt", "_epoch"]
    names = _Names(plan)
    # 1. where each of the batch's columns sits in the change's column list (0: the change lacks it)
    frame = frame.select(
        *base[:-1], "new_values", "new_unchanged", "old_values", epoch.alias("_epoch"),
        F.array(*(F.array_position("column_names", F.lit(n)).cast("int") for n in names.names)).alias("_p"))

    def realigned(build) -> Column:  # noqa: ANN001
        cells = []
        for i in range(len(names.names)):
            p = F.element_at(F.col("_p"), F.lit(i + 1))
            cells.append(F.when(p > 0, build(p)))
        return F.array(*cells)

    # 2. the values realigned; R5.5: an unchanged TOASTed value is taken from the old full row when there is one
    frame = frame.select(
        *base,
        F.when(F.col("new_values").isNotNull(), realigned(lambda i: F.when(
            (F.col("old_kind") == "O") & F.try_element_at("new_unchanged", i), F.try_element_at("old_values", i))
            .otherwise(F.try_element_at("new_values", i)))).alias("_nv"),
        F.when(F.col("new_values").isNotNull() & F.coalesce(F.col("old_kind") != "O", F.lit(True)),
               realigned(lambda i: F.try_element_at("new_unchanged", i))).alias("_um"),
        F.when(F.col("old_values").isNotNull(), realigned(lambda i: F.try_element_at("old_values", i))).alias("_ov"),
        F.array(*(F.element_at(F.col("_p"), F.lit(i + 1)) > 0 for i in range(len(names.names)))).alias("_cv"))
    # 3. judge: each filter and publish flag once per row
    judged = {}
    for name, (what, side) in _JUDGED.items():
        judged[name] = (_published(plan, side) if what == "published" else _matches(plan, names, what, side))
    frame = frame.select(*base, "_nv", "_um", "_ov", "_cv", *(_sql(e).alias(n) for n, e in judged.items()))
    # 4. decide
    decision = _sql(_decision())
    if plan.skip_lsn is not None:  # ALTER SUBSCRIPTION … SKIP: the whole transaction is dropped
        decision = F.when(F.col("commit_lsn") == F.lit(plan.skip_lsn), F.lit("s")).otherwise(decision)
    new_key = _array_per_target(plan, lambda t: F.array(*(names.column("_nv", k) for k in t.key)))
    old_key = _array_per_target(plan, lambda t: F.array(*(names.column("_ov", k) for k in t.key)))
    frame = frame.select(*base, "_nv", "_um", "_ov", "_cv", decision.alias("_op"),
                         new_key.alias("_newkey"), old_key.alias("_oldkey"))
    # 5. what is staged: the key the change is found by, its values and flags, whether it is a barrier
    dml = F.col("_op").isin("I", "U")
    has_old = F.col("_ov").isNotNull()
    frame = frame.select(
        "_tgt", "_epoch", "commit_lsn", "seq", "lsn", "xid", "kind", "schema", "table", "column_names",
        "truncate_restart_identity", "_op",
        F.when(F.col("_op") == "I", F.col("_newkey")).when(F.col("_op") == "D", F.col("_oldkey"))
        .when(F.col("_op") == "U", F.when(has_old, F.col("_oldkey")).otherwise(F.col("_newkey")))
        .alias("_key"),
        F.when(dml, _array_per_target(plan, lambda t: F.array(*(names.column("_nv", c) for c in t.columns))))
        .alias("_vals"),
        F.when(dml, _flags(plan, names)).alias("_fl"),
        ((F.col("_op") == "U") & has_old & ~F.col("_oldkey").eqNullSafe(F.col("_newkey"))).alias("_barrier"))
    return DecidedBatch(frame.localCheckpoint(eager=False), plan)


def write_stage(frame: DataFrame, conninfo: dict[str, str]) -> int:
    """COPY the staged rows into ``rowfilter.apply_stage`` from the executors; returns the rows written.

    Arrow batches go to a Python task that streams them as CSV into ``COPY … FROM STDIN``
    (pg/apply_target.copy_stage): one subscriber transaction per task; reruns are told apart by token.
    """
    columns = frame.columns
    written = frame.mapInArrow(partial(copy_stage, conninfo, columns), "rows long")
    return int(written.agg(F.sum("rows")).collect()[0][0] or 0)
