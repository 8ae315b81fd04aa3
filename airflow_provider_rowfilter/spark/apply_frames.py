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
   key existed before the batch and once as if not; the subscriber chooses.

Everything runs in the JVM (Spark SQL expressions and higher-order functions); no row passes
through Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark import StorageLevel
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
from airflow_provider_rowfilter.spark.jdbc import JdbcConnection

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


def _matches(plan: ApplyPlan, action: str, values: str) -> exp.Expression:
    """The action's effective filter (ORed publications; NULL counts as no match) on one side of the change."""
    def one(target: TargetPlan, rules: EpochRules) -> exp.Expression:
        text = rules.filters.get(action)
        if text is None:
            return _lit(True)
        return exp.func("coalesce", filter_expression(text, rules.column_types, values), _lit(False))
    return _per_rules(plan, one, _lit(False))


def _decision(plan: ApplyPlan) -> exp.Expression:
    """What each change is applied as (``_op``)."""
    new_u, old_u = _matches(plan, "update", "_nm"), _matches(plan, "update", "_om")
    transform = exp.Case()
    for (old, new), kind in UPDATE_DECISION_TABLE.items():
        transform = transform.when(
            exp.and_(old_u.copy() if old else exp.not_(old_u.copy()), new_u.copy() if new else exp.not_(new_u.copy())),
            _lit(_OP[kind]))
    update = exp.If(this=exp.Is(this=_col("old_kind"), expression=exp.Null()),
                    true=exp.If(this=new_u, true=_lit("U"), false=_lit("x")), false=transform)

    def gated(action: str, decided: exp.Expression) -> exp.Expression:
        return exp.If(this=_published(plan, action), true=decided, false=_lit("u"))

    kind = _col("kind")
    return (exp.Case()
            .when(exp.EQ(this=kind, expression=_lit("insert")),
                  gated("insert", exp.If(this=_matches(plan, "insert", "_nm"), true=_lit("I"), false=_lit("x"))))
            .when(exp.EQ(this=kind, expression=_lit("update")), gated("update", update))
            .when(exp.EQ(this=kind, expression=_lit("delete")),
                  gated("delete", exp.If(this=_matches(plan, "delete", "_om"), true=_lit("D"), false=_lit("x"))))
            .when(exp.EQ(this=kind, expression=_lit("truncate")), gated("truncate", _lit("T")))
            .else_(_lit("u")))


def _read(values: str, name: str) -> Column:
    return F.try_element_at(F.col(values), F.lit(name))


def _array_per_target(plan: ApplyPlan, build) -> Column:
    """``CASE _tgt WHEN i THEN build(target) END`` with Column values."""
    result = None
    for t in plan.targets:
        cond = F.col("_tgt") == t.index
        result = F.when(cond, build(t)) if result is None else result.when(cond, build(t))
    return result if result is not None else F.lit(None)


def _flags(plan: ApplyPlan) -> Column:
    """Per subscriber column: 0 the change carries it, 1 it does not (see pg/apply_target.py)."""
    result = None
    for t in plan.targets:
        for e, rules in enumerate(t.rules):
            if rules is None:
                continue
            cells = []
            for c in t.columns:
                carried = F.array_contains(F.col("column_names"), F.lit(c)) if rules.publishes_column(c) else F.lit(False)
                unchanged = (F.col("_op") == "U") & F.coalesce(_read("_um", c), F.lit(False))
                cells.append(F.when(~carried | unchanged, F.lit(1)).otherwise(F.lit(0)))
            cond = (F.col("_tgt") == t.index) & (F.col("_epoch") == e)
            built = F.array(*cells)
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
    """The judged changes of a batch (persisted: summarised and reduced from one evaluation)."""

    frame: DataFrame
    plan: ApplyPlan
    _facts: BatchFacts | None = None

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
                             F.lit(None).cast("array<int>").alias("_fl"), F.lit(True).alias("_barrier")))
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
        cells = F.zip_with("_vals", "_fl", lambda v, f: F.struct(v.alias("v"), f.alias("f")))
        keyed = (ops.where(~F.col("_barrier"))
                 .withColumn("_cells", F.when(F.col("_op") == "D", F.lit(None)).otherwise(cells))
                 .withColumn("_n", ncols)
                 .groupBy("_tgt", "_phase", "_key")
                 .agg(F.sort_array(F.collect_list(F.struct("commit_lsn", "seq", "_op", "xid", "_cells")))
                      .alias("ops"), F.first("_n").alias("_n")))
        present, absent = F.expr(_fold(True, plan.policy)), F.expr(_fold(False, plan.policy))
        keys = keyed.select(
            F.lit(token).alias("token"), F.col("_tgt").alias("target"), F.col("_phase").alias("phase"),
            F.lit("K").alias("row_kind"), F.lit(None).cast("string").alias("op"), F.to_json("_key").alias("key"),
            *(_count_ops(op).alias(name) for op, name in (("I", "n_insert"), ("U", "n_update"), ("D", "n_delete"))),
            present.alias("p"), absent.alias("a"))
        outcome = []
        for side in ("p", "a"):
            s = F.col(side)
            outcome += [
                s["present"].alias(f"{side}_present"),
                F.to_json(F.transform(s["cells"], lambda c: c["v"])).alias(f"{side}_vals"),
                F.array_join(F.transform(s["cells"], lambda c: c["f"].cast("string")), "").alias(f"{side}_flags"),
                s["clsn"].alias(f"{side}_conflict_lsn"), s["cxid"].alias(f"{side}_conflict_xid"),
                s["mu"].alias(f"{side}_missing_update"), s["md"].alias(f"{side}_missing_delete"),
            ]
        keys = keys.select("token", "target", "phase", "row_kind", "op", "key", "n_insert", "n_update", "n_delete",
                           *outcome)
        barriers = ops.where("_barrier").select(
            F.lit(token).alias("token"), F.col("_tgt").alias("target"), F.col("_phase").alias("phase"),
            F.lit("B").alias("row_kind"), F.col("_op").alias("op"), F.to_json("_key").alias("key"),
            "commit_lsn", "xid", F.col("truncate_restart_identity").alias("restart_identity"),
            F.to_json("_vals").alias("p_vals"),
            # In a single UPDATE a column the change does not carry keeps the subscriber's value (flag 2).
            F.array_join(F.transform("_fl", lambda f: F.when(f == 1, F.lit(2)).otherwise(f).cast("string")), "")
            .alias("p_flags"))
        return keys.unionByName(barriers, allowMissingColumns=True)


def _count_ops(op: str) -> Column:
    return F.size(F.filter("ops", lambda o: o["_op"] == F.lit(op))).cast("long")


def _fold(existed: bool, policy: str) -> str:
    """The net effect of one key's changes, in commit order, from a start where the key existed or not.

    State: present, cells (value and flag per column; 2 = the subscriber's current value), the first
    conflict (commit_lsn, xid), and the UPDATEs/DELETEs that found no row (R14.5: skipped, counted).
    """
    conflict = "s.present AND s.clsn IS NULL" if policy == "error" else "false"
    missed_update = (
        "named_struct('present', true, 'cells', transform(o._cells, c -> IF(c.f = 0, c, "
        "named_struct('v', CAST(NULL AS STRING), 'f', 1))), 'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu, 'md', s.md)"
        if policy == "upsert" else
        "named_struct('present', false, 'cells', s.cells, 'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu + 1L, 'md', s.md)")
    start = (f"named_struct('present', {'true' if existed else 'false'}, "
             "'cells', array_repeat(named_struct('v', CAST(NULL AS STRING), 'f', 2), _n), "
             "'clsn', CAST(NULL AS BIGINT), 'cxid', CAST(NULL AS BIGINT), 'mu', 0L, 'md', 0L)")
    return f"""aggregate(ops, {start}, (s, o) -> CASE o._op
        WHEN 'I' THEN named_struct('present', true, 'cells', o._cells,
            'clsn', IF({conflict}, o.commit_lsn, s.clsn), 'cxid', IF({conflict}, o.xid, s.cxid), 'mu', s.mu, 'md', s.md)
        WHEN 'U' THEN IF(s.present,
            named_struct('present', true, 'cells', zip_with(s.cells, o._cells, (a, b) -> IF(b.f = 0, b, a)),
                         'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu, 'md', s.md),
            {missed_update})
        ELSE IF(s.present,
            named_struct('present', false, 'cells', s.cells, 'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu, 'md', s.md),
            named_struct('present', false, 'cells', s.cells, 'clsn', s.clsn, 'cxid', s.cxid, 'mu', s.mu, 'md', s.md + 1L))
        END)"""


def decide(spark: SparkSession, paths: list[str], plan: ApplyPlan) -> DecidedBatch:
    """Read the segments and judge every change of the subscribed tables (persisted: unpersist when done)."""
    raw = spark.read.parquet(*paths)
    routes = spark.createDataFrame(
        [(leaf.schema, leaf.name, t.index, t.position) for t in plan.targets for leaf in t.leaves],
        "_leaf_schema string, _leaf_table string, _tgt int, _position long")
    frame = (raw.join(F.broadcast(routes), (raw["schema"] == routes["_leaf_schema"])
                      & (raw["table"] == routes["_leaf_table"]))
             .where(F.col("commit_lsn") >= F.col("_position")))
    epoch = F.lit(0)
    for i, start in enumerate(plan.epochs[1:], start=1):
        epoch = F.when(F.col("commit_lsn") >= F.lit(start), F.lit(i)).otherwise(epoch)
    base = ["commit_lsn", "seq", "lsn", "xid", "kind", "schema", "table", "column_names", "old_kind",
            "truncate_restart_identity", "_tgt"]
    # R5.5: an unchanged TOASTed value is taken from the old full row when there is one.
    frame = frame.select(
        *base, epoch.alias("_epoch"),
        F.expr("IF(new_values IS NULL, NULL, map_from_arrays(column_names, CASE WHEN old_kind = 'O' THEN "
               "transform(new_values, (v, i) -> IF(new_unchanged[i], old_values[i], v)) ELSE new_values END))"
               ).alias("_nm"),
        F.expr("IF(new_values IS NULL OR old_kind = 'O', NULL, map_from_arrays(column_names, new_unchanged))"
               ).alias("_um"),
        F.expr("IF(old_values IS NULL, NULL, map_from_arrays(column_names, old_values))").alias("_om"))
    decision = _sql(_decision(plan))
    if plan.skip_lsn is not None:  # ALTER SUBSCRIPTION … SKIP: the whole transaction is dropped
        decision = F.when(F.col("commit_lsn") == F.lit(plan.skip_lsn), F.lit("s")).otherwise(decision)
    frame = frame.select(*base, "_epoch", "_nm", "_um", "_om", decision.alias("_op"))
    new_key = _array_per_target(plan, lambda t: F.array(*(_read("_nm", k) for k in t.key)))
    old_key = _array_per_target(plan, lambda t: F.array(*(_read("_om", k) for k in t.key)))
    frame = frame.select(*base, "_epoch", "_nm", "_om", "_um", "_op",
                         new_key.alias("_newkey"), old_key.alias("_oldkey"))
    dml = F.col("_op").isin("I", "U")
    frame = frame.select(
        "_tgt", "_epoch", "commit_lsn", "seq", "lsn", "xid", "kind", "schema", "table", "column_names",
        "truncate_restart_identity", "_op",
        F.when(F.col("_op") == "I", F.col("_newkey")).when(F.col("_op") == "D", F.col("_oldkey"))
        .when(F.col("_op") == "U", F.coalesce(F.when(F.col("_om").isNotNull(), F.col("_oldkey")), F.col("_newkey")))
        .alias("_key"),
        F.when(dml, _array_per_target(plan, lambda t: F.array(*(_read("_nm", c) for c in t.columns)))).alias("_vals"),
        F.when(dml, _flags(plan)).alias("_fl"),
        ((F.col("_op") == "U") & F.col("_om").isNotNull() & ~F.col("_oldkey").eqNullSafe(F.col("_newkey")))
        .alias("_barrier"))
    return DecidedBatch(frame.persist(StorageLevel.MEMORY_AND_DISK), plan)


def write_stage(frame: DataFrame, jdbc: JdbcConnection) -> None:
    """Append the staged rows to ``rowfilter.apply_stage`` (each task one transaction; reruns are told apart by token)."""
    writer = (frame.write.format("jdbc").option("url", jdbc.url).option("dbtable", STAGE_TABLE)
              .option("batchsize", "5000").option("isolationLevel", "READ_COMMITTED").mode("append"))
    for key, value in jdbc.properties.items():
        writer = writer.option(key, value)
    writer.option("reWriteBatchedInserts", "true").save()
