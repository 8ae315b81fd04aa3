"""Translate a validated row filter into a Spark SQL expression with PostgreSQL's meaning.

Built from the typed syntax tree (never by pasting strings): every operand is converted to the
type PostgreSQL computes in, so Spark performs the same integer, decimal or float arithmetic, the
same ``character`` padding rules and the same three-valued logic. The expression reads columns of
the relation under their own names, typed as :func:`pg_types.spark_type` says.

This module holds the entry points and the translator of operators, logic, comparisons, patterns,
conditionals and casts; rows and arrays by core/filters/spark_composites.py, function calls by
core/filters/spark_functions.py, and the
Spark SQL building blocks with PostgreSQL's errors (checked float and date arithmetic, LIKE escapes,
typed reads of PostgreSQL's text forms) live in core/filters/spark_sql.py.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence

from sqlglot import exp

from airflow_provider_rowfilter.core.errors import UntranslatableFilterError
from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.analysis_comparisons import in_list_groups
from airflow_provider_rowfilter.core.filters.dialect import identifier_name
from airflow_provider_rowfilter.core.filters.folding import Undecided, fold
from airflow_provider_rowfilter.core.filters.folding_values import UNKNOWN
from airflow_provider_rowfilter.core.filters.folding_values import convert as folded_at
from airflow_provider_rowfilter.core.filters.functions import function_name
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.row_filter import RowFilter
from airflow_provider_rowfilter.core.filters.spark_composites import CompositeTranslation
from airflow_provider_rowfilter.core.filters.spark_functions import FunctionTranslation
from airflow_provider_rowfilter.core.filters.spark_numeric import NumericTranslation
from airflow_provider_rowfilter.core.filters.spark_sql import (
    LAMBDA_ELEMENT,
    LAMBDA_SCALAR,
    ascii_lower,
    cast,
    checked_date,
    checked_float,
    checked_float4,
    evaluated_is_null,
    fn,
    like_pattern,
    like_per_row,
    operand,
    raise_error,
)
from airflow_provider_rowfilter.core.filters.spark_sql import typed_read as typed_read  # the apply's reads
from airflow_provider_rowfilter.core.filters.text import quantified_array, regex_of, row_fields


def to_spark_sql(row_filter: RowFilter) -> str:
    """Return the Spark SQL text of ``row_filter`` (a boolean expression; NULL means no match)."""
    return to_spark_text(to_spark_expression(row_filter))


def to_spark_expression(row_filter: RowFilter) -> exp.Expr:
    """Return the Spark-dialect sqlglot expression of ``row_filter``."""
    try:
        folded = fold(row_filter)  # what PostgreSQL's planner computes once (core/filters/folding.py)
    except Undecided as e:
        raise UntranslatableFilterError(
            f"a constant condition that decides whether {e} is evaluated",
            hint="PostgreSQL's planner decides such a condition before any row; simplify the constant "
            "condition (or remove the branch it guards), or publish from the catalog of a PostgreSQL 15+ "
            "publisher, where PostgreSQL evaluates the filter itself") from None
    if folded.error is not None:  # PostgreSQL raises for every row, whichever branch the call stands in
        return raise_error(folded.error)
    return _Translator(row_filter, folded.values).value(row_filter.tree)


def spark_or(filters: Sequence[RowFilter]) -> exp.Expr:
    """The OR of ``filters`` (each parenthesised) as one Spark expression tree: what one action publishes."""
    return exp.or_(*(exp.Paren(this=to_spark_expression(f)) for f in filters))


def to_spark_text(tree: exp.Expr) -> str:
    """A translated tree as Spark SQL text (for people: the apply renders its own projections)."""
    return tree.sql(dialect="spark")


class _Translator(FunctionTranslation, CompositeTranslation, NumericTranslation):
    def __init__(self, rf: RowFilter, folded: dict[int, object] | None = None) -> None:
        self.rf = rf
        self.folded = folded or {}  # what the planner computed (core/filters/folding.py): rendered as constants

    def _folded(self, node: exp.Expr, target: PgType) -> exp.Expr | None:
        """The constant PostgreSQL's planner leaves for ``node``, converted to ``target``; None when it left none."""
        if id(node) not in self.folded:
            return None
        value = folded_at(self.folded[id(node)], self.rf.types[id(node)], target)
        return None if value is UNKNOWN else self.constant(value, target)

    # A node's Spark expression, converted to the type its parent wants.
    def value(self, node: exp.Expr) -> exp.Expr:
        own = self.rf.types[id(node)]
        target = self.rf.targets.get(id(node), own)
        if id(node) in self.rf.constants:
            value = self.rf.constants[id(node)]
            if own.name == "bpchar" and target.name != "bpchar" and isinstance(value, str):
                value = value.rstrip(" ")  # the cast to text drops character(n)'s trailing spaces (rtrim1)
            return self.constant(value, target)
        folded = self._folded(node, target)
        if folded is not None:
            return folded
        built = self.build(node, own)
        return self.convert(built, own, target)

    def convert(self, built: exp.Expr, own: PgType, target: PgType) -> exp.Expr:
        if own == target or own.is_unknown:
            return built
        if own.name == "bpchar" and target.name != "bpchar":
            return fn("rtrim", built)
        if own.is_text_family and target.is_text_family:
            return built
        if own.name == "numeric":  # core/filters/spark_numeric.py: NaN and the infinities
            if target.name == "numeric":
                return self.numeric_widen(built, target)
            if target.is_integer:
                return self.numeric_to_integer(built, target)
            if target.name in ("float4", "float8"):
                return self.numeric_to_float(built, target)
        if own.is_integer and target.name == "numeric":
            return self.numeric_from_integer(built, own, target)
        if own.name in ("float4", "float8") and target.is_integer:
            return cast(fn("bround", built, exp.Literal.number(0)), target)  # rint: half to even
        if own.name == "float8" and target.name == "float4":
            return checked_float4(built, cast(built.copy(), target))
        if own.name == "int4" and target.name == "bool":
            return exp.NEQ(this=built, expression=exp.Literal.number(0))
        return cast(built, target)

    def constant(self, value: object, t: PgType) -> exp.Expr:
        if t.is_unknown:
            t = T.TEXT
        if value is None:
            return cast(exp.Null(), t) if T.spark_type(t) else exp.Null()
        if t.element is not None:  # an array constant (array_in's elements, every dimension in order)
            assert isinstance(value, list), value
            return cast(exp.Array(expressions=[self.constant(v, t.element) for v in value]), t)
        if t.name == "bool":
            return exp.Boolean(this=bool(value))
        if t.is_text_family or t.name == "uuid":
            return exp.Literal.string(str(value))
        if t.is_integer:
            assert isinstance(value, (int, decimal.Decimal)), value
            literal = exp.Literal.number(int(value))
            return literal if t.name == "int4" else cast(literal, t)
        if t.name == "numeric":
            d = decimal.Decimal(str(value))
            if t.precision is None:
                digits = d.as_tuple()
                exponent = digits.exponent if isinstance(digits.exponent, int) else 0
                scale = max(-exponent, 0)
                t = PgType("numeric", max(len(digits.digits), scale + 1) + max(exponent, 0), scale)
            return self.numeric_constant(d, t)
        if t.name in ("float4", "float8"):
            assert isinstance(value, (int, float, decimal.Decimal)), value
            f = float(value)
            text = "NaN" if f != f else ("Infinity" if f == float("inf") else
                                         "-Infinity" if f == float("-inf") else repr(f))
            return cast(exp.Literal.string(text), t)
        if t.name == "date":
            assert isinstance(value, datetime.date), value
            return cast(exp.Literal.string(value.isoformat()), t)
        if t.name == "timestamp":
            if not isinstance(value, datetime.datetime):  # a date constant compared with a timestamp
                assert isinstance(value, datetime.date), value
                value = datetime.datetime.combine(value, datetime.time())
            return cast(exp.Literal.string(value.isoformat(sep=" ")), t)
        if t.name == "timestamptz":
            assert isinstance(value, datetime.datetime)
            return cast(exp.Literal.string(value.isoformat(sep=" ")), t)
        raise UntranslatableFilterError(f"a constant of type {t}")

    def build(self, node: exp.Expr, t: PgType) -> exp.Expr:
        handler = getattr(self, f"_t_{type(node).__name__}", None)
        if handler is None:
            name = function_name(node) if isinstance(node, exp.Func) else ""
            handler = getattr(self, f"_f_{name}", None)
        if handler is None:
            raise UntranslatableFilterError(f"expression {node.sql(dialect='postgres')!r}")
        return handler(node, t)

    # --- leaves and logic -------------------------------------------------------------------------
    def _t_Paren(self, node, t):
        return exp.Paren(this=self.value(node.this))

    def _t_Column(self, node, t):
        return exp.column(identifier_name(node.this), quoted=True)

    def _t_And(self, node, t):
        return exp.And(this=self.value(node.left), expression=self.value(node.right))

    def _t_Or(self, node, t):
        return exp.Or(this=self.value(node.left), expression=self.value(node.right))

    def _t_Not(self, node, t):
        return exp.Not(this=exp.Paren(this=self.value(node.this)))

    def _t_Is(self, node, t):
        negate = bool(node.args.get("negate"))
        fields = row_fields(node.this)
        if fields is not None:
            # ExecEvalRowNull: IS NULL when every field is NULL, IS NOT NULL when none is
            tests: list[exp.Expr] = [self._is_null(f) for f in fields]
            if negate:
                tests = [exp.Not(this=exp.Paren(this=x)) for x in tests]
            return exp.Paren(this=exp.and_(*tests)) if tests else exp.true()
        inner = self.value(node.this)
        if isinstance(node.expression, exp.Boolean):
            # IS [NOT] TRUE/FALSE never yield NULL
            truth = bool(node.expression.this)
            test: exp.Expr = exp.Coalesce(this=inner if truth else exp.Not(this=exp.Paren(this=inner)),
                                expressions=[exp.false()])
            return exp.Not(this=exp.Paren(this=test)) if negate else test
        test = self._is_null(node.this, inner)
        return exp.Not(this=exp.Paren(this=test)) if negate else test

    def _is_null(self, node: exp.Expr, value: exp.Expr | None = None) -> exp.Expr:
        """``x IS NULL`` as ExecEvalNullTest runs it: ``x`` computed first (spark_sql.py ``evaluated_is_null``),
        unless it is a column's read or a constant, which raise nothing."""
        value = self.value(node) if value is None else value
        bare = node
        while isinstance(bare, exp.Paren):
            bare = bare.this
        if isinstance(bare, (exp.Column, exp.Literal, exp.Null, exp.Boolean)) \
                or id(bare) in self.rf.constants or self.folded.get(id(bare), UNKNOWN) is not UNKNOWN:
            return exp.Is(this=operand(value), expression=exp.Null())  # Spark cannot parse x LIKE y IS NULL
        return evaluated_is_null(value)

    # --- comparisons ------------------------------------------------------------------------------
    def _compared(self, node: exp.Expr) -> exp.Expr:
        """An operand as a comparison sees it: character(n) compares without trailing spaces
        (bpchareq, bpcharlt … use bcTruelen), while its value keeps the padding PostgreSQL stores."""
        built = self.value(node)
        if self.rf.targets.get(id(node), self.rf.types[id(node)]).name == "bpchar":
            return fn("rtrim", built)
        return operand(built)

    def _cmp(self, cls, node):
        quantified = quantified_array(node.right)
        if quantified is not None:
            kind, array = quantified
            if row_fields(node.left) is not None:  # record_eq / record_ne on each element
                return self._row_quantified(cls, node, kind, array)
            if isinstance(array, exp.Array):
                return self._quantified(cls, node, kind, array)
            return self._quantified_column(cls, node, kind, array)  # an array column or an array constant
        fields = row_fields(node.left)
        if fields is not None:
            return self._row_comparison(cls, fields, row_fields(node.right) or [])
        return cls(this=self._compared(node.left), expression=self._compared(node.right))

    def _t_EQ(self, node, t):  return self._cmp(exp.EQ, node)
    def _t_NEQ(self, node, t): return self._cmp(exp.NEQ, node)
    def _t_GT(self, node, t):  return self._cmp(exp.GT, node)
    def _t_GTE(self, node, t): return self._cmp(exp.GTE, node)
    def _t_LT(self, node, t):  return self._cmp(exp.LT, node)
    def _t_LTE(self, node, t): return self._cmp(exp.LTE, node)
    def _t_NullSafeEQ(self, node, t): return self._cmp(exp.NullSafeEQ, node)

    def _t_NullSafeNEQ(self, node, t):
        return exp.Not(this=exp.Paren(this=self._cmp(exp.NullSafeEQ, node)))

    def _t_Between(self, node, t):
        low, high = node.args["low"], node.args["high"]
        x_low, x_high = self._subject(node.this, low), self._subject(node.this, high)
        lo, hi = self._compared(low), self._compared(high)
        if x_low != x_high:  # x converted differently for each bound: x >= low AND x <= high
            both = exp.and_(exp.GTE(this=x_low, expression=lo), exp.LTE(this=x_high, expression=hi))
            if node.args.get("symmetric"):
                other = exp.and_(exp.GTE(this=x_high.copy(), expression=hi.copy()),
                                 exp.LTE(this=x_low.copy(), expression=lo.copy()))
                return exp.Paren(this=exp.or_(exp.Paren(this=both), exp.Paren(this=other)))
            return exp.Paren(this=both)
        x = x_low
        forward = exp.Between(this=x, low=lo, high=hi)
        if node.args.get("symmetric"):
            backward = exp.Between(this=x.copy(), low=hi.copy(), high=lo.copy())
            return exp.Paren(this=exp.Or(this=forward, expression=backward))
        return forward

    def _t_In(self, node, t):
        # PostgreSQL's x = ANY (ARRAY[column-free items]) OR x = item … (see in_list_groups)
        array, pairwise = in_list_groups(node)
        terms: list[exp.Expr] = []
        if array:
            terms.append(exp.In(this=self._subject(node.this, array[0]),
                                expressions=[self._compared(e) for e in array]))
        for e in pairwise:
            terms.append(exp.EQ(this=self._subject(node.this, e), expression=self._compared(e)))
        return terms[0] if len(terms) == 1 else exp.Paren(this=exp.or_(*terms))

    def _subject(self, subject: exp.Expr, item: exp.Expr) -> exp.Expr:
        """The left side of ``x IN (…)`` converted to the type it is compared with ``item`` in."""
        own = self.rf.types[id(subject)]
        common = self.rf.targets.get(id(item), self.rf.types[id(item)])
        if id(subject) in self.rf.constants:
            built = self.constant(self.rf.constants[id(subject)], common)
        else:
            built = self._folded(subject, common) or self.convert(self.build(subject, own), own, common)
        return fn("rtrim", built) if common.name == "bpchar" else operand(built)

    # --- arithmetic -------------------------------------------------------------------------------
    def _arith(self, cls, node, t):
        left, right = self.value(node.left), self.value(node.right)
        lt = self.rf.types[id(node.left)]
        if lt.name == "date":
            rt = self.rf.types[id(node.right)]
            if rt.name == "date":
                return fn("datediff", left, right)
            return checked_date(cls, left, right)
        if t.name == "numeric":
            lt_ = self.rf.targets.get(id(node.left), self.rf.types[id(node.left)])
            rt_ = self.rf.targets.get(id(node.right), self.rf.types[id(node.right)])
            result = self.numeric_arith(cls, left, lt_, right, rt_, t)
            return self._dividend_first(cls, node, left, result, t)
        result = cast(cls(this=exp.Paren(this=left), expression=exp.Paren(this=right)), t)
        if t.name in ("float4", "float8"):
            result = checked_float(cls, left, right, result, t)
        return self._dividend_first(cls, node, left, result, t)

    def _dividend_first(self, cls, node, left: exp.Expr, result: exp.Expr, t: PgType) -> exp.Expr:
        """``a / b`` and ``a % b`` with ``a`` computed first, as PostgreSQL computes a strict operator's arguments
        in order: Spark's division computes its divisor first and, when that is NULL, never computes the dividend,
        whose error (``(i8 * 816) % position(c IN v)`` with ``v`` NULL: ``bigint out of range``) PostgreSQL
        raises. When ``a`` is NULL, ``b`` is skipped, as Spark skips the right operand of ``+`` after a NULL."""
        if cls not in (exp.Div, exp.Mod, exp.IntDiv):
            return result
        return exp.Case(ifs=[exp.If(this=self._is_null(node.left, left.copy()), true=cast(exp.Null(), t))], default=result)

    def _t_Add(self, node, t): return self._arith(exp.Add, node, t)
    def _t_Sub(self, node, t): return self._arith(exp.Sub, node, t)
    def _t_Mul(self, node, t): return self._arith(exp.Mul, node, t)
    def _t_Mod(self, node, t): return self._arith(exp.Mod, node, t)

    def _t_Div(self, node, t):
        if t.is_integer:  # PostgreSQL's integer division truncates toward zero, as Spark's DIV does
            left = self.value(node.left)
            return self._dividend_first(exp.IntDiv, node, left, cast(exp.IntDiv(
                this=exp.Paren(this=left), expression=exp.Paren(this=self.value(node.right))), t), t)
        return self._arith(exp.Div, node, t)

    def _t_Neg(self, node, t):
        if t.name == "numeric":
            return self.numeric_neg(self.value(node.this), t)
        return exp.Neg(this=exp.Paren(this=self.value(node.this)))

    def _t_DPipe(self, node, t):
        return fn("concat", self.value(node.left), self.value(node.right))

    # --- patterns ---------------------------------------------------------------------------------
    def _t_Like(self, node, t, *, escape: str | None = None, fold: bool = False):
        quantified = quantified_array(node.right)
        if quantified is not None:
            # x LIKE ANY/ALL (ARRAY[…]): the operator on each element, ORed (ANY) or ANDed (ALL), which are
            # ScalarArrayOpExpr's NULL rules; NOT LIKE is the operator !~~ on each element
            kind, array = quantified
            if not isinstance(array, exp.Array):  # a text[] column or constant: the operator on each element
                test = like_per_row(LAMBDA_SCALAR.copy(), LAMBDA_ELEMENT.copy(), bool(node.args.get("negate")), fold)
                return self._each_element(kind, array, test, self.value(node.left))
            terms = [self._like(node, self.value(node.left), e, escape, fold) for e in array.expressions]
            return exp.Paren(this=exp.or_(*terms) if kind == "any" else exp.and_(*terms))
        return self._like(node, self.value(node.left), node.right, escape, fold)

    def _like(self, node, subject: exp.Expr, pattern_node: exp.Expr, escape: str | None, fold: bool) -> exp.Expr:
        pattern: exp.Expr
        if id(pattern_node) in self.rf.constants and self.rf.constants[id(pattern_node)] is not None:
            pattern = exp.Literal.string(like_pattern(str(self.rf.constants[id(pattern_node)]), escape))
        elif escape in (None, "\\"):
            return like_per_row(subject, self.value(pattern_node), bool(node.args.get("negate")), fold)
        else:
            raise UntranslatableFilterError("LIKE with a non-constant pattern and a custom ESCAPE")
        if fold:
            subject, pattern = ascii_lower(subject), ascii_lower(pattern)
        like = exp.Like(this=subject, expression=pattern)
        return exp.Not(this=exp.Paren(this=like)) if node.args.get("negate") else like

    def _t_ILike(self, node, t):
        return self._t_Like(node, t, fold=True)

    # --- regular expressions (core/filters/regex.py) ------------------------------------------------
    def _regex(self, node, t, test: exp.Expr, element: exp.Expr | None = None) -> exp.Expr:
        quantified = quantified_array(node.expression) if element is None else None
        if quantified is not None:
            # x ~ ANY/ALL (ARRAY[…]): the operator (!~ when negated) with each element as its pattern, ORed (ANY)
            # or ANDed (ALL), which are ScalarArrayOpExpr's NULL rules; an element whose pattern PostgreSQL cannot
            # compile raises only when reached, as ExecEvalScalarArrayOp stops at the first decisive element
            kind, array = quantified
            terms = [self._regex(node, t, test, e) for e in array.expressions]
            return exp.Paren(this=exp.or_(*terms) if kind == "any" else exp.and_(*terms))
        pattern, error = regex_of(self.rf, node, element)
        subject = self.value(test.this)
        if error is not None:  # PostgreSQL raises when it compiles the pattern, for a non-NULL subject
            return exp.Case(ifs=[exp.If(this=exp.Is(this=operand(subject), expression=exp.Null()),
                                        true=cast(exp.Null(), T.BOOL))], default=raise_error(error))
        if pattern is None:
            return cast(exp.Null(), T.BOOL)
        # Parenthesised: Spark's RLIKE binds looser than a comparison (``a RLIKE p <= b`` is ``a RLIKE (p <= b)``),
        # PostgreSQL's ``~`` tighter (``(a ~ p) <= b``).
        like = exp.Paren(this=exp.RegexpLike(this=subject, expression=exp.Literal.string(pattern)))
        return exp.Not(this=like) if test.args.get("negate") else like

    def _t_RegexpLike(self, node, t): return self._regex(node, t, node)
    def _t_RegexpILike(self, node, t): return self._regex(node, t, node)
    def _t_SimilarTo(self, node, t): return self._regex(node, t, node)

    def _t_Escape(self, node, t):
        if isinstance(node.this, exp.SimilarTo):
            return self._regex(node, t, node.this)
        escape = self.rf.constants.get(id(node.expression))
        if not isinstance(escape, str) or len(escape) > 1:
            raise UntranslatableFilterError("LIKE … ESCAPE with a non-constant escape character")
        return self._t_Like(node.this, t, escape=escape, fold=isinstance(node.this, exp.ILike))

    def _t_Coalesce(self, node, t):
        return exp.Coalesce(this=self.value(node.this), expressions=[self.value(e) for e in node.expressions])

    def _t_Greatest(self, node, t):
        return exp.Greatest(this=self.value(node.this), expressions=[self.value(e) for e in node.expressions])

    def _t_Least(self, node, t):
        return exp.Least(this=self.value(node.this), expressions=[self.value(e) for e in node.expressions])

    def _t_Nullif(self, node, t):
        if self.rf.targets.get(id(node.this), self.rf.types[id(node.this)]).name == "bpchar":
            # equal ignoring trailing spaces, but the value returned keeps its own
            equal = exp.EQ(this=self._compared(node.this), expression=self._compared(node.expression))
            return exp.Case(ifs=[exp.If(this=equal, true=cast(exp.Null(), t))], default=self.value(node.this))
        compared = self.rf.targets.get(id(node.this), self.rf.types[id(node.this)])
        value = exp.Nullif(this=self.value(node.this), expression=self.value(node.expression))
        # compared in the common type, returned in the first argument's (core/filters: _a_Nullif)
        return value if compared == t else cast(value, t)

    def _t_Case(self, node, t):
        subject = node.this
        ifs = []
        for branch in node.args["ifs"]:
            if subject is not None:
                common = self.rf.targets.get(id(subject), self.rf.types[id(subject)])
                left = self.convert(self.build(subject, self.rf.types[id(subject)]), self.rf.types[id(subject)], common) \
                    if id(subject) not in self.rf.constants else self.constant(self.rf.constants[id(subject)], common)
                right = self._compared(branch.this)
                if common.name == "bpchar":
                    left = fn("rtrim", left)
                cond: exp.Expr = exp.EQ(this=left, expression=right)
            else:
                cond = self.value(branch.this)
            ifs.append(exp.If(this=cond, true=self.value(branch.args["true"])))
        default = node.args.get("default")
        return exp.Case(ifs=ifs, default=self.value(default) if default is not None else cast(exp.Null(), t))

    def _t_Collate(self, node, t):
        return self.value(node.this)

    def _t_Cast(self, node, t):
        inner = self.rf.types[id(node.this)]
        built = self.convert(self.value(node.this), inner, t)
        if t.name == "numeric" and inner.name == "numeric" and node.to.expressions:
            return self.numeric_typmod(built, t)  # numeric(p,s): apply_typmod_special refuses an infinity
        if t.is_text_family and t.precision is not None and inner != t:
            # An explicit cast to varchar(n) truncates silently; character(n) truncates and pads.
            n = exp.Literal.number(t.precision)
            if t.name == "bpchar":
                return fn("rpad", built, n, exp.Literal.string(" "))
            return fn("substring", built, exp.Literal.number(1), n)
        return built

