"""The fold on Spark: a key's net effect, from a start where it existed and one where it did not, as
expression trees (spark/apply_frames.py ``DecidedBatch.staged`` evaluates them once per key).
"""

from __future__ import annotations

from sqlglot import exp

from airflow_provider_rowfilter.spark.sql_trees import col, fn, get, lambda_, lit, long, null, struct, var


def _outcome(present: exp.Expr, vals: exp.Expr | None = None, flags: exp.Expr | None = None,
             clsn: exp.Expr | None = None, cxid: exp.Expr | None = None,
             mu: exp.Expr | None = None, md: exp.Expr | None = None) -> exp.Expr:
    """A key's net effect from one start: subscriber/apply_stage.py ``OUTCOME_FIELDS``, and the values."""
    return struct(present=present, vals=null("array<string>") if vals is None else vals,
                   flags=null("string") if flags is None else flags,
                   conflict_lsn=null("bigint") if clsn is None else clsn,
                   conflict_xid=null("bigint") if cxid is None else cxid,
                   missing_update=long(0) if mu is None else mu, missing_delete=long(0) if md is None else md)


def _by_op(op: exp.Expr, insert: exp.Expr, update: exp.Expr,
           delete: exp.Expr) -> exp.Expr:
    """``CASE op WHEN 'I' THEN insert WHEN 'U' THEN update ELSE delete END``."""
    return exp.Case(this=op, ifs=[exp.If(this=lit("I"), true=insert), exp.If(this=lit("U"), true=update)],
                    default=delete)


def single(existed: bool, policy: str) -> exp.Expr:
    """The net effect of a key's only change (most keys of a batch), without a fold.

    The same as :func:`folded` on a one-element list, but without the values: they are the change's
    own, staged once for both outcomes. A value whose flag is not 0 is never read.
    """
    o = exp.Bracket(this=col("ops"), expressions=[lit(0)])
    conflict = existed and policy == "error"
    insert = _outcome(lit(True), flags=get(o, "_fl"), clsn=get(o, "commit_lsn") if conflict else None,
                      cxid=get(o, "xid") if conflict else None)
    if existed:
        update = _outcome(lit(True), flags=fn("translate", get(o, "_fl"), lit("1"), lit("2")))
    elif policy == "upsert":
        update = _outcome(lit(True), flags=get(o, "_fl"))
    else:
        update = _outcome(lit(False), mu=long(1))
    delete = _outcome(lit(False), md=long(0 if existed else 1))
    return _by_op(get(o, "_op"), insert, update, delete)


def folded(existed: bool, policy: str) -> exp.Expr:
    """The net effect of a key's changes, in commit order, from a start where the key existed or not.

    State: present, cells (value and flag per column; 2 = the subscriber's current value), the first
    conflict (commit_lsn, xid), and the UPDATEs/DELETEs that found no row (skipped and counted, as
    worker.c apply_handle_update_internal and apply_handle_delete_internal report them).
    """
    s, o = var("s"), var("o")

    def state(present: exp.Expr, cells: exp.Expr, *, clsn: exp.Expr | None = None,
              cxid: exp.Expr | None = None, mu: exp.Expr | None = None) -> exp.Expr:
        return struct(present=present, cells=cells, clsn=get(s, "clsn") if clsn is None else clsn,
                       cxid=get(s, "cxid") if cxid is None else cxid, mu=get(s, "mu") if mu is None else mu,
                       md=get(s, "md"))

    def cell(value: exp.Expr, flag: exp.Expr) -> exp.Expr:
        return struct(v=value, f=flag)

    # the change's cells: its values, each with its flag as a number
    cells = fn("zip_with", get(o, "_vals"), fn("split", get(o, "_fl"), lit("")),
                lambda_(cell(var("v"), exp.cast(var("f"), "int")), "v", "f"))
    carried = exp.EQ(this=get(var("c"), "f"), expression=lit(0))
    if policy == "upsert":  # a new row from the cells the UPDATE carries, the others their default
        missed_update = state(lit(True), fn("transform", cells.copy(), lambda_(
            exp.If(this=carried.copy(), true=var("c"), false=cell(null("string"), lit(1))), "c")))
    else:
        missed_update = state(lit(False), get(s, "cells"),
                              mu=exp.Add(this=get(s, "mu"), expression=long(1)))
    conflict = (exp.and_(get(s, "present"), exp.Is(this=get(s, "clsn"), expression=exp.Null()))
                if policy == "error" else lit(False))
    insert = state(lit(True), cells.copy(), clsn=exp.If(this=conflict, true=get(o, "commit_lsn"), false=get(s, "clsn")),
                   cxid=exp.If(this=conflict.copy(), true=get(o, "xid"), false=get(s, "cxid")))
    update = exp.If(this=get(s, "present"), true=state(lit(True), fn("zip_with", get(s, "cells"), cells.copy(), lambda_(
        exp.If(this=exp.EQ(this=get(var("b"), "f"), expression=lit(0)), true=var("b"), false=var("a")), "a", "b"))),
        false=missed_update)
    gone = struct(present=lit(False), cells=get(s, "cells"), clsn=get(s, "clsn"), cxid=get(s, "cxid"),
                   mu=get(s, "mu"), md=get(s, "md"))
    missed_delete = struct(present=lit(False), cells=get(s, "cells"), clsn=get(s, "clsn"), cxid=get(s, "cxid"),
                            mu=get(s, "mu"), md=exp.Add(this=get(s, "md"), expression=long(1)))
    delete = exp.If(this=get(s, "present"), true=gone, false=missed_delete)
    start = struct(present=lit(existed), cells=fn("array_repeat", cell(null("string"), lit(2)), col("_n")),
                    clsn=null("bigint"), cxid=null("bigint"), mu=long(0), md=long(0))
    finish = _outcome(get(s, "present"), fn("transform", get(s, "cells"), lambda_(get(var("c"), "v"), "c")),
                      fn("array_join", fn("transform", get(s, "cells"),
                                            lambda_(exp.cast(get(var("c"), "f"), "string"), "c")), lit("")),
                      get(s, "clsn"), get(s, "cxid"), get(s, "mu"), get(s, "md"))
    return fn("aggregate", col("ops"), start, lambda_(_by_op(get(o, "_op"), insert, update, delete), "s", "o"),
               lambda_(finish, "s"))


def single_vals() -> exp.Expr:
    """A single change's values, staged as they are (``NULL`` for a DELETE's, or for a fold)."""
    o = exp.Bracket(this=col("ops"), expressions=[lit(0)])
    return exp.If(this=exp.and_(exp.EQ(this=fn("size", col("ops")), expression=lit(1)),
                                exp.NEQ(this=get(o, "_op"), expression=lit("D"))),
                  true=get(o.copy(), "_vals"), false=exp.Null())
