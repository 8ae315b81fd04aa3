"""Row filters, the planner's constant folding: what PostgreSQL computes once, when the filter is prepared.

pgoutput prepares a row filter with ``expression_planner`` (pgoutput.c ``pgoutput_row_filter_init``), so
``eval_const_expressions`` (src/backend/optimizer/util/clauses.c) runs every immutable function or operator
whose arguments are all constants once, before any row: ``-32768::smallint`` is ``-(32768::smallint)``
(``::`` binds tighter than the unary minus, and only a minus before a bare number is part of the
constant, gram.y ``doNegate``), and ``int42(32768)`` raises ``smallint out of range`` for every change of
the table, whichever branch it stands in. Spark would raise only where a row evaluates it, and its
optimizer may decide the comparison around it without evaluating it at all.

:func:`fold` walks a typed filter as ``eval_const_expressions`` does and computes what it can with
PostgreSQL's semantics (integer range checks, truncating division, ``rint`` and half-away rounding in
casts, float overflow and underflow, ``date ± integer``'s range, three-valued logic), pruning where the
planner stops folding:

- an AND stops at its first constant FALSE, an OR at its first constant TRUE (``simplify_and_arguments``,
  ``simplify_or_arguments``), and ``BETWEEN`` / ``IN (…)`` are such ANDs and ORs (parse_expr.c
  ``transformAExprBetween``, ``transformAExprIn``), and so are a row ``=`` (``<>``, ``IS [NOT] DISTINCT
  FROM``) of its pairs (``make_row_comparison_op``, ``make_row_distinct_op``);
- a ``CASE`` drops a constant FALSE or NULL alternative without folding its result, and stops at a
  constant TRUE one (its ELSE is then never folded);
- ``COALESCE`` stops at its first non-NULL constant.

It returns the error PostgreSQL raises for every row, or the values it decided (core/filters/spark_translation.py
renders a decided node as its constant, so Spark sees the expression the planner leaves). A constant it
cannot compute is "unknown": nothing is claimed for it, and where an unknown constant condition decides
whether an error is reached, the filter is refused rather than guessed (:class:`Undecided`). The operators and
casts on the values themselves are core/filters/folding_values.py's.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass, field

from sqlglot import exp

from airflow_provider_rowfilter.core.filters.analysis_comparisons import in_list_groups
from airflow_provider_rowfilter.core.filters.folding_values import (
    COMPARISONS,
    UNKNOWN,
    PlannerError,
    arith,
    cast_value,
    comparison,
    convert,
    date_arith,
)
from airflow_provider_rowfilter.core.filters.functions import function_name
from airflow_provider_rowfilter.core.filters.grammar import quantified_array
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.regex import UnsupportedRegex
from airflow_provider_rowfilter.core.filters.text import regex_of, row_fields

_ARITHMETIC: dict[type, str] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%"}


class Undecided(Exception):
    """Whether PostgreSQL folds (and raises for) a part depends on a constant this module cannot compute."""


@dataclass
class Folded:
    """What the planner leaves of a filter: the error it raises for every row, or the values it decided."""

    error: str | None = None
    values: dict[int, object] = field(default_factory=dict)  # id(node) -> its value (None: NULL)


def fold(rf) -> Folded:
    """Fold ``rf``'s constants as PostgreSQL's planner does (raises :class:`Undecided`, see the module)."""
    folder = _Folder(rf)
    try:
        folder.value(rf.tree, uncertain=False)
    except PlannerError as e:
        return Folded(error=str(e))
    return Folded(values={k: v for k, v in folder.decided.items() if k not in rf.constants})


def _column_free(node: object) -> bool:
    """Whether ``node`` (an expression, or a tuple or list of them) reads no column: the planner may fold it."""
    if isinstance(node, exp.Expr):
        return not any(isinstance(n, exp.Column) for n in node.walk())
    if isinstance(node, (tuple, list)):
        return all(_column_free(n) for n in node)
    return True


class _Folder:
    def __init__(self, rf) -> None:
        self.rf = rf
        self.decided: dict[int, object] = {}

    def own(self, node: exp.Expr) -> PgType | None:
        return self.rf.types.get(id(node))

    def target(self, node: exp.Expr) -> PgType | None:
        return self.rf.targets.get(id(node), self.rf.types.get(id(node)))

    def value(self, node: exp.Expr, uncertain: bool) -> object:
        """``node``'s value in its own type, UNKNOWN, or PlannerError (Undecided where ``uncertain``: an unknown
        constant before it might have stopped the planner first)."""
        if id(node) in self.rf.constants:
            return self.rf.constants[id(node)]
        try:
            v = self._compute(node, uncertain)
        except PlannerError:
            if uncertain:
                raise Undecided(node.sql(dialect="postgres")) from None
            raise
        if v is not UNKNOWN:
            self.decided[id(node)] = v
        return v

    def at_target(self, node: exp.Expr, uncertain: bool) -> object:
        """``node``'s value converted to the type its parent computes in (an implicit, widening coercion)."""
        return convert(self.value(node, uncertain), self.own(node), self.target(node))

    # --- the walk ---------------------------------------------------------------------------------
    def _compute(self, node: exp.Expr, uncertain: bool) -> object:
        if isinstance(node, exp.Paren):
            return self.value(node.this, uncertain)
        if isinstance(node, exp.Column):
            return UNKNOWN
        if isinstance(node, (exp.And, exp.Or)):
            return self._junction(node.flatten(), isinstance(node, exp.Or), uncertain,
                                  lambda arg, u: self.at_target(arg, u))
        if isinstance(node, exp.Not):
            inner = node.this.unnest()
            if isinstance(inner, exp.Between):
                return self._between(inner, uncertain, negated=True)
            if isinstance(inner, exp.In):
                return self._in(inner, uncertain, negated=True)
            v = self.value(node.this, uncertain)
            return v if v is None or v is UNKNOWN else not v
        if isinstance(node, exp.Between):
            return self._between(node, uncertain, negated=False)
        if isinstance(node, exp.In):
            return self._in(node, uncertain, negated=False)
        if isinstance(node, exp.Case):
            return self._case(node, uncertain)
        if isinstance(node, (exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.NullSafeNEQ)) and _row(node.left) \
                and _row(node.right):  # a Binary
            return self._row_comparison(node, uncertain)
        if isinstance(node, exp.Coalesce):
            return self._coalesce(node, uncertain)
        if isinstance(node, exp.Cast):
            return cast_value(self.value(node.this, uncertain), self.own(node.this), self.own(node))
        if isinstance(node, (exp.RegexpLike, exp.RegexpILike)) and quantified_array(node.expression) is not None:
            return self._quantified_regex(node, uncertain)
        children = [c for c in node.iter_expressions() if not isinstance(c, exp.DataType)]
        values = [self.at_target(c, uncertain) for c in children]  # a function's arguments are all folded
        if any(v is UNKNOWN for v in values):
            return UNKNOWN
        return self._operator(node, children, values)

    def _junction(self, args, is_or: bool, uncertain: bool, value_of, subject: exp.Expr | None = None) -> object:
        """An AND (OR) in argument order: it stops at the first constant FALSE (TRUE). ``subject``: the ``x``
        every argument compares (BETWEEN, IN)."""
        result: object = not is_or
        for arg in args:
            v = value_of(arg, uncertain)
            if v is UNKNOWN:
                uncertain = uncertain or _column_free((arg, subject))
                result = UNKNOWN
            elif v is None:
                result = None if result is not UNKNOWN else UNKNOWN
            elif bool(v) is is_or:
                return is_or
        return result

    def _between(self, node: exp.Between, uncertain: bool, negated: bool) -> object:
        """``x BETWEEN a AND b`` is ``x >= a AND x <= b`` (NOT: ``x < a OR x > b``); SYMMETRIC ORs (ANDs) both orders."""
        x, low, high = node.this, node.args["low"], node.args["high"]

        def compare(pair, u):
            bound, op = pair
            return self._compare(op, x, bound, u)
        lower, upper = (exp.LT, exp.GT) if negated else (exp.GTE, exp.LTE)
        forward = [(low, lower), (high, upper)]
        if not node.args.get("symmetric"):
            return self._junction(forward, negated, uncertain, compare, subject=x)
        backward = [(high, lower), (low, upper)]
        return self._junction(
            [forward, backward], not negated, uncertain,
            lambda side, u: self._junction(side, negated, u, compare, subject=x), subject=x)

    def _in(self, node: exp.In, uncertain: bool, negated: bool) -> object:
        """``x IN (…)``: ``x = ANY (ARRAY[column-free items])`` then ``x = item`` for the others, ORed (NOT IN:
        ``<> ALL`` and ``<>``, ANDed)."""
        array, pairwise = in_list_groups(node)
        op = exp.NEQ if negated else exp.EQ
        terms: list = [("array", array)] if array else []
        terms += [("item", e) for e in pairwise]

        def term(t, u):
            kind, what = t
            if kind == "item":
                return self._compare(op, node.this, what, u)
            x = self.at_target_of(node.this, what[0], u)
            items = [self.at_target(e, u) for e in what]
            return self._quantified(op, x, items, self.target(what[0]), "all" if negated else "any")
        return self._junction(terms, not negated, uncertain, term, subject=node.this)

    def at_target_of(self, subject: exp.Expr, item: exp.Expr, uncertain: bool) -> object:
        """``x`` of ``x IN (…)`` converted to the type it is compared with ``item`` in."""
        return convert(self.value(subject, uncertain), self.own(subject), self.target(item))

    def _compare(self, op, left: exp.Expr, right: exp.Expr, uncertain: bool) -> object:
        a = self.at_target_of(left, right, uncertain)
        b = self.at_target(right, uncertain)
        return comparison(op, a, b, self.target(right))

    def _quantified(self, op, x: object, items: list, t: PgType | None, kind: str) -> object:
        results = [comparison(op, x, v, t) for v in items]
        if UNKNOWN in results:
            return UNKNOWN
        if kind == "any":
            return True if True in results else (None if None in results else False)
        return False if False in results else (None if None in results else True)

    def _row_comparison(self, node: exp.Binary, uncertain: bool) -> object:
        """``(a, b) = (c, d)`` is the AND of the pairs' ``=``, ``<>`` the OR of their ``<>``, IS [NOT] DISTINCT FROM
        the [NOT] OR of their DistinctExprs (parse_expr.c make_row_comparison_op, make_row_distinct_op): the planner
        simplifies them as any AND and OR. (``< <= > >=`` is a RowCompareExpr, whose fields are all folded.)"""
        pairs = list(zip(row_fields(node.left) or [], row_fields(node.right) or [], strict=True))
        if isinstance(node, (exp.EQ, exp.NEQ)):
            op = type(node)
            return self._junction(pairs, op is exp.NEQ, uncertain, lambda p, u: self._compare(op, p[0], p[1], u))
        distinct = self._junction(pairs, True, uncertain, self._distinct)
        if isinstance(node, exp.NullSafeNEQ) or distinct is UNKNOWN:
            return distinct
        return not distinct

    def _distinct(self, pair: tuple[exp.Expr, exp.Expr], uncertain: bool) -> object:
        a, b = self.at_target_of(pair[0], pair[1], uncertain), self.at_target(pair[1], uncertain)
        if a is UNKNOWN or b is UNKNOWN:
            return UNKNOWN
        if a is None or b is None:
            return (a is None) != (b is None)
        return comparison(exp.NEQ, a, b, self.target(pair[1]))

    def _case(self, node: exp.Case, uncertain: bool) -> object:
        operand = node.this
        subject = self.value(operand, uncertain) if operand is not None else UNKNOWN
        kept = False  # an alternative with a condition that is not constant: the CASE has no constant value
        for alternative in node.args.get("ifs") or []:
            if operand is None:
                cond = self.at_target(alternative.this, uncertain)
            elif subject is UNKNOWN:
                self.value(alternative.this, uncertain)
                cond = UNKNOWN
            else:  # CASE x WHEN v: x = v, the constant subject put in (eval_const_expressions' CaseTestExpr)
                cond = self._compare(exp.EQ, operand, alternative.this, uncertain)
            if cond is UNKNOWN:
                # kept, and its result folded; a column-free condition the planner might decide makes what
                # follows uncertain
                self.value(alternative.args["true"], uncertain)
                uncertain = uncertain or _column_free(alternative.this) and (operand is None or _column_free(operand))
                kept = True
                continue
            if not cond:
                continue  # a constant FALSE or NULL: dropped, its result never folded
            result = self.at_target(alternative.args["true"], uncertain)
            return UNKNOWN if kept else result  # a constant TRUE: nothing after it is folded, the ELSE neither
        default = node.args.get("default")
        result = self.at_target(default, uncertain) if default is not None else None
        return UNKNOWN if kept else result

    def _coalesce(self, node: exp.Coalesce, uncertain: bool) -> object:
        """Arguments in order: NULL constants dropped; the first non-NULL constant ends the list (nothing after
        it is folded) and is the value when only NULLs stood before it."""
        only_nulls = True
        for arg in [node.this, *node.expressions]:
            v = self.at_target(arg, uncertain)
            if v is None:
                continue
            if v is UNKNOWN:
                uncertain = uncertain or _column_free(arg)
                only_nulls = False
                continue
            return v if only_nulls else UNKNOWN
        return None if only_nulls else UNKNOWN

    # --- operators --------------------------------------------------------------------------------
    def _operator(self, node: exp.Expr, children: list[exp.Expr], values: list) -> object:
        t = self.own(node)
        cls = type(node)
        if cls in COMPARISONS and len(children) == 2 and quantified_array(children[1]) is None:
            return comparison(cls, values[0], values[1], self.target(children[1]))
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null) and not _row(node.this):
            return (values[0] is None) != bool(node.args.get("negate"))
        if any(v is None for v in values):
            # strict: NULL in, NULL out, nothing run (the pattern and string checks below need values)
            return None if isinstance(node, (exp.Neg, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Abs)) \
                else UNKNOWN
        if isinstance(node, exp.Neg):
            return arith("-", 0, values[0], t)
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
            left = self.own(children[0])
            if left is not None and left.name == "date":
                return date_arith(type(node), values[0], values[1], self.own(children[1]))
            if left is None:
                return UNKNOWN
            return arith(_ARITHMETIC[type(node)], values[0], values[1], t)
        if isinstance(node, exp.Abs) or (isinstance(node, exp.Func) and function_name(node) == "abs"):
            if isinstance(values[0], decimal.Decimal):
                return values[0].copy_abs()  # numeric_abs: NaN stays NaN, -Infinity is Infinity
            return arith("-", 0, values[0], t) if values[0] < 0 else values[0]
        self._raises(node, values)
        return UNKNOWN

    def _quantified_regex(self, node: exp.Expr, uncertain: bool) -> object:
        """``x ~ ANY/ALL (ARRAY[…])`` of constants: the planner evaluates it (ExecEvalScalarArrayOp), compiling
        each element's pattern until one decides; the match itself is left to Spark. A pattern PostgreSQL cannot
        compile raises here when it is the first non-NULL element; after another one, whether it is reached
        depends on a match not computed here (Undecided)."""
        quantified = quantified_array(node.expression)
        assert quantified is not None
        subject = self.value(node.this, uncertain)
        elements = [self.value(e, uncertain) for e in quantified[1].expressions]
        if subject is UNKNOWN or subject is None or any(v is UNKNOWN for v in elements):
            return UNKNOWN  # a NULL subject: strict, NULL before any element is looked at
        compiled = False
        for e, v in zip(quantified[1].expressions, elements, strict=True):
            if v is None:
                continue
            try:
                error = regex_of(self.rf, node, e)[1]
            except UnsupportedRegex:
                return UNKNOWN
            if error is not None:
                if compiled or uncertain:
                    raise Undecided(node.sql(dialect="postgres"))
                raise PlannerError(error)
            compiled = True
        return UNKNOWN

    def _raises(self, node: exp.Expr, values: list) -> None:
        """The string and pattern functions' errors (varlena.c, regexp.c) for constant arguments."""
        if isinstance(node, exp.Substring) and len(values) == 3 and int(values[2]) < 0:
            raise PlannerError("negative substring length not allowed")
        if isinstance(node, exp.SplitPart) and int(values[2]) == 0:
            raise PlannerError("field position must not be zero")
        if isinstance(node, exp.Repeat) and len(str(values[0]).encode()) * max(int(values[1]), 0) + 4 > 1073741823:
            raise PlannerError("requested length too large")
        if isinstance(node, (exp.RegexpLike, exp.RegexpILike, exp.SimilarTo, exp.Escape)):
            try:
                error = regex_of(self.rf, node)[1]
            except UnsupportedRegex:
                return
            if error is not None:
                raise PlannerError(error)


def _row(node: exp.Expr) -> bool:
    return isinstance(node, exp.Tuple) or (isinstance(node, exp.Anonymous) and node.name.upper() == "ROW")
