"""Spark SQL built as sqlglot expression trees, rendered once per projection (spark/judge.py,
spark/fold_expressions.py, spark/apply_frames.py).

A projection is one ``selectExpr`` of the SQL text of a tree: a few Py4J calls per batch rather than one
per expression node (thousands, seconds in a cold JVM).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from sqlglot import exp

from airflow_provider_rowfilter.core.apply.plan import ApplyPlan, TargetPlan, case_over


def text(e: exp.Expr, alias: str | None = None) -> str:
    """Spark SQL text of ``e`` (``AS alias``), for ``selectExpr``: one Py4J call per projection, not per node."""
    return (exp.alias_(e, alias) if alias else e).sql(dialect="spark", identify=True)


def sql(e: exp.Expr) -> Column:
    return F.expr(text(e))


def fn(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


def col(name: str) -> exp.Expr:
    return exp.column(name)


def lit(value: object) -> exp.Expr:
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    return exp.Literal.string(str(value))


def is_target(target: TargetPlan, epoch: int | None = None) -> exp.Expr:
    cond: exp.Expr = exp.EQ(this=col("_tgt"), expression=lit(target.index))
    if epoch is not None:
        cond = exp.and_(cond, exp.EQ(this=col("_epoch"), expression=lit(epoch)))
    return cond


def per_rules(plan: ApplyPlan, value, default: exp.Expr) -> exp.Expr:
    """CASE over (table, epoch): ``value(target, rules)`` where the table is subscribed in that epoch."""
    return case_over(
        ((is_target(t, e), value(t, rules)) for t in plan.targets for e, rules in enumerate(t.rules) if rules is not None),
        default)


def per_target(plan: ApplyPlan, build) -> exp.Expr:
    """``CASE WHEN _tgt = i THEN build(target) … END`` (NULL for no target)."""
    return case_over((is_target(t), build(t)) for t in plan.targets)


def null(type_: str) -> exp.Expr:
    return exp.cast(exp.Null(), type_)


def long(value: int) -> exp.Expr:
    return exp.cast(lit(value), "bigint")


def get(of: exp.Expr, field: str) -> exp.Expr:
    """``of.field``: a field of a struct (a lambda variable's, or an array element's)."""
    return exp.Dot(this=of, expression=exp.to_identifier(field))


def var(name: str) -> exp.Expr:
    """A lambda variable."""
    return exp.column(name)


def lambda_(body: exp.Expr, *variables: str) -> exp.Expr:
    return exp.Lambda(this=body, expressions=[exp.to_identifier(v) for v in variables])


def struct(**fields: exp.Expr) -> exp.Expr:
    return fn("named_struct", *(e for name, value in fields.items() for e in (lit(name), value)))
