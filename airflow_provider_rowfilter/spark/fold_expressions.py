"""The fold on Spark: a key's net effect, from a start where it existed and one where it did not, as
expression trees (spark/apply_frames.py ``DecidedBatch.staged`` evaluates them once per key).
"""

from __future__ import annotations

from sqlglot import exp

from airflow_provider_rowfilter.core.apply.fold_rules import OPERATIONS, Step, step
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
    """The net effect of a key's only change (most keys of a batch), without a fold: each operation's rule
    (core/apply/fold_rules.py ``step``) from the start, as an expression.

    The same as :func:`folded` on a one-element list, but without the values: they are the change's
    own, staged once for both outcomes. A value whose flag is not 0 is never read.
    """
    def outcome(rule: Step) -> exp.Expr:
        o = exp.Bracket(this=col("ops"), expressions=[lit(0)])
        flags = None
        if rule.present:  # core/apply/fold_rules.py single_flags
            flags = get(o, "_fl")
            if rule.cells == "overlay":
                flags = fn("translate", flags, lit("1"), lit("2"))
            elif rule.cells == "keep":
                flags = fn("translate", flags, lit("01"), lit("22"))
        return _outcome(lit(rule.present), flags=flags,
                        clsn=get(o.copy(), "commit_lsn") if rule.conflict else None,
                        cxid=get(o.copy(), "xid") if rule.conflict else None,
                        mu=long(1) if rule.counted == "missing_update" else None,
                        md=long(1) if rule.counted == "missing_delete" else None)

    first_op = get(exp.Bracket(this=col("ops"), expressions=[lit(0)]), "_op")
    return _by_op(first_op, *(outcome(step(op, existed, policy)) for op in OPERATIONS))


def folded(existed: bool, policy: str) -> exp.Expr:
    """The net effect of a key's changes, in commit order, from a start where the key existed or not: each
    change's rule (core/apply/fold_rules.py ``step``), chosen by the operation and whether the key has a row, as
    the step of an ``aggregate``.

    State: present, cells (value and flag per column; 2 = the subscriber's current value), the first
    conflict (commit_lsn, xid), and the UPDATEs/DELETEs that found no row (skipped and counted, as
    worker.c apply_handle_update_internal and apply_handle_delete_internal report them).
    """
    s, o = var("s"), var("o")

    def cell(value: exp.Expr, flag: exp.Expr) -> exp.Expr:
        return struct(v=value, f=flag)

    def changed_cells() -> exp.Expr:
        """The change's cells: its values, each with its flag as a number."""
        return fn("zip_with", get(o, "_vals"), fn("split", get(o, "_fl"), lit("")),
                  lambda_(cell(var("v"), exp.cast(var("f"), "int")), "v", "f"))

    def carried(c: str) -> exp.Expr:
        return exp.EQ(this=get(var(c), "f"), expression=lit(0))

    def cells(kind: str) -> exp.Expr:
        if kind == "set":
            return changed_cells()
        if kind == "overlay":  # the cells the change carries overwritten, the others kept
            return fn("zip_with", get(s, "cells"), changed_cells(),
                      lambda_(exp.If(this=carried("b"), true=var("b"), false=var("a")), "a", "b"))
        if kind == "restart":  # a new row from the cells the change carries, the others their default
            return fn("transform", changed_cells(),
                      lambda_(exp.If(this=carried("c"), true=var("c"), false=cell(null("string"), lit(1))), "c"))
        return get(s, "cells")

    def first_conflict(field: str, value: str) -> exp.Expr:
        return exp.If(this=exp.Is(this=get(s, "clsn"), expression=exp.Null()), true=get(o, value),
                      false=get(s, field))

    def count(field: str, rule: Step, counted: str) -> exp.Expr:
        """The state's count ``field``, plus one where the rule counts the change as ``counted``."""
        return exp.Add(this=get(s, field), expression=long(1)) if rule.counted == counted else get(s, field)

    def transition(rule: Step) -> exp.Expr:
        return struct(present=lit(rule.present), cells=cells(rule.cells),
                      clsn=first_conflict("clsn", "commit_lsn") if rule.conflict else get(s, "clsn"),
                      cxid=first_conflict("cxid", "xid") if rule.conflict else get(s, "cxid"),
                      mu=count("mu", rule, "missing_update"), md=count("md", rule, "missing_delete"))

    def by_row(op: str) -> exp.Expr:
        """The rule where the key has a row, and where it has none; one expression when they are the same."""
        found, missed = transition(step(op, True, policy)), transition(step(op, False, policy))
        return found if found == missed else exp.If(this=get(s, "present"), true=found, false=missed)

    start = struct(present=lit(existed), cells=fn("array_repeat", cell(null("string"), lit(2)), col("_n")),
                   clsn=null("bigint"), cxid=null("bigint"), mu=long(0), md=long(0))
    finish = _outcome(get(s, "present"), fn("transform", get(s, "cells"), lambda_(get(var("c"), "v"), "c")),
                      fn("array_join", fn("transform", get(s, "cells"),
                                          lambda_(exp.cast(get(var("c"), "f"), "string"), "c")), lit("")),
                      get(s, "clsn"), get(s, "cxid"), get(s, "mu"), get(s, "md"))
    return fn("aggregate", col("ops"), start, lambda_(_by_op(get(o, "_op"), *map(by_row, OPERATIONS)), "s", "o"),
              lambda_(finish, "s"))


def single_vals() -> exp.Expr:
    """A single change's values, staged as they are (``NULL`` for a DELETE's, or for a fold)."""
    o = exp.Bracket(this=col("ops"), expressions=[lit(0)])
    return exp.If(this=exp.and_(exp.EQ(this=fn("size", col("ops")), expression=lit(1)),
                                exp.NEQ(this=get(o, "_op"), expression=lit("D"))),
                  true=get(o.copy(), "_vals"), false=exp.Null())
