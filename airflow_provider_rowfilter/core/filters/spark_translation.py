"""Translate a validated row filter into a Spark SQL expression with PostgreSQL's meaning.

Built from the typed syntax tree (never by pasting strings): every operand is converted to the
type PostgreSQL computes in, so Spark performs the same integer, decimal or float arithmetic, the
same ``character`` padding rules and the same three-valued logic. The expression reads columns of
the relation under their own names, typed as :func:`pg_types.spark_type` says.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Sequence

from sqlglot import exp

from airflow_provider_rowfilter.core.errors import UntranslatableFilterError
from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.analysis import in_list_groups
from airflow_provider_rowfilter.core.filters.dialect import identifier_name
from airflow_provider_rowfilter.core.filters.folding import UNKNOWN, Undecided, fold
from airflow_provider_rowfilter.core.filters.folding import convert as folded_at
from airflow_provider_rowfilter.core.filters.functions import function_name
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.row_filter import RowFilter
from airflow_provider_rowfilter.core.filters.text import quantified_array, regex_of, row_fields

# PostgreSQL's lower()/upper()/ILIKE under the C collation map ASCII letters only.
_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = _UPPER.lower()


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
        return _raise(folded.error)
    return _Translator(row_filter, folded.values).value(row_filter.tree)


def spark_or(filters: Sequence[RowFilter]) -> exp.Expr:
    """The OR of ``filters`` (each parenthesised) as one Spark expression tree: what one action publishes."""
    return exp.or_(*(exp.Paren(this=to_spark_expression(f)) for f in filters))


def to_spark_text(tree: exp.Expr) -> str:
    """A translated tree as Spark SQL text (for people: the apply renders its own projections)."""
    return tree.sql(dialect="spark")


def _dtype(t: PgType) -> exp.DataType:
    spark = T.spark_type(t)
    if spark is None:
        raise UntranslatableFilterError(f"type {t} has no exact Spark counterpart")
    return exp.DataType.build(spark, dialect="spark")


def _cast(node: exp.Expr, t: PgType) -> exp.Expr:
    return exp.Cast(this=node, to=_dtype(t))


def _fn(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


# The element of an array column, in exists()/forall(): a name no column of a filter's reads can take (they are
# the table's own names, or the apply's element_at(_nv, n)).
_LAMBDA_ELEMENT = exp.Var(this="__rowfilter_element")
# The compared value x of ``x op ANY/ALL (array_column)``, bound once outside the elements' lambda.
_LAMBDA_SCALAR = exp.Var(this="__rowfilter_scalar")

# The elements of PostgreSQL's text form of an array (arrayfuncs.c array_out): a quoted element (backslash before
# " and \) or an unquoted one; braces of every dimension and the bounds decoration ([0:1]={…}) are no element.
_ARRAY_ELEMENT = r'"(?:[^"\\]|\\.)*"|[^,{}"]+'


def typed_read(text: exp.Expr, t: PgType) -> exp.Expr:
    """A value's PostgreSQL text form (``text``, a STRING expression) read as ``t``'s Spark type: a cast, or for an
    array its elements, each unquoted (an unquoted ``NULL`` is NULL: array_out quotes any element spelled so) and
    cast, all dimensions in order, as ``op ANY/ALL`` walks them."""
    if t.element is None:
        return _cast(text, t)
    element = exp.Var(this="__rowfilter_text")
    unquoted = exp.Case(
        ifs=[exp.If(this=_fn("startswith", element.copy(), exp.Literal.string('"')),
                    true=_fn("regexp_replace", _fn("substring", element.copy(), exp.Literal.number(2),
                                                   exp.Sub(this=_fn("length", element.copy()),
                                                           expression=exp.Literal.number(2))),
                             exp.Literal.string(r"\\(.)"), exp.Literal.string("$1"))),
             exp.If(this=exp.EQ(this=element.copy(), expression=exp.Literal.string("NULL")), true=exp.Null())],
        default=element.copy())
    undecorated = _fn("regexp_replace", text, exp.Literal.string(r"^\[[^=]*\]="), exp.Literal.string(""))
    elements = _fn("regexp_extract_all", undecorated, exp.Literal.string(_ARRAY_ELEMENT), exp.Literal.number(0))
    return _fn("transform", elements, exp.Lambda(this=_cast(unquoted, t.element), expressions=[element.copy()]))


_ATOMS = (exp.Column, exp.Literal, exp.Paren, exp.Cast, exp.Func, exp.Boolean, exp.Null, exp.Case)


def _operand(e: exp.Expr) -> exp.Expr:
    """Parenthesise a compound operand: ``b = (x <> y)`` must not come out as ``b = x <> y``."""
    return e if isinstance(e, _ATOMS) else exp.Paren(this=e)


class _Translator:
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
            return self.constant(self.rf.constants[id(node)], target)
        folded = self._folded(node, target)
        if folded is not None:
            return folded
        built = self.build(node, own)
        return self.convert(built, own, target)

    def convert(self, built: exp.Expr, own: PgType, target: PgType) -> exp.Expr:
        if own == target or own.is_unknown:
            return built
        if own.name == "bpchar" and target.name != "bpchar":
            return _fn("rtrim", built)
        if own.is_text_family and target.is_text_family:
            return built
        if own.name in ("numeric", "float4", "float8") and target.is_integer:
            rounding = "round" if own.name == "numeric" else "bround"  # numeric: half away from 0; float: rint
            return _cast(_fn(rounding, built, exp.Literal.number(0)), target)
        if own.name == "float8" and target.name == "float4":
            return _checked_float4(built, _cast(built.copy(), target))
        if own.name == "int4" and target.name == "bool":
            return exp.NEQ(this=built, expression=exp.Literal.number(0))
        return _cast(built, target)

    def constant(self, value: object, t: PgType) -> exp.Expr:
        if t.is_unknown:
            t = T.TEXT
        if value is None:
            return _cast(exp.Null(), t) if T.spark_type(t) else exp.Null()
        if t.name == "bool":
            return exp.Boolean(this=bool(value))
        if t.is_text_family or t.name == "uuid":
            return exp.Literal.string(str(value))
        if t.is_integer:
            assert isinstance(value, (int, decimal.Decimal)), value
            literal = exp.Literal.number(int(value))
            return literal if t.name == "int4" else _cast(literal, t)
        if t.name == "numeric":
            d = decimal.Decimal(str(value))
            if t.precision is None:
                digits = d.as_tuple()
                exponent = digits.exponent if isinstance(digits.exponent, int) else 0
                scale = max(-exponent, 0)
                t = PgType("numeric", max(len(digits.digits), scale + 1) + max(exponent, 0), scale)
            return _cast(exp.Literal.string(format(d, "f")), t)
        if t.name in ("float4", "float8"):
            assert isinstance(value, (int, float, decimal.Decimal)), value
            f = float(value)
            text = "NaN" if f != f else ("Infinity" if f == float("inf") else
                                         "-Infinity" if f == float("-inf") else repr(f))
            return _cast(exp.Literal.string(text), t)
        if t.name == "date":
            assert isinstance(value, datetime.date), value
            return _cast(exp.Literal.string(value.isoformat()), t)
        if t.name == "timestamp":
            if not isinstance(value, datetime.datetime):  # a date constant compared with a timestamp
                assert isinstance(value, datetime.date), value
                value = datetime.datetime.combine(value, datetime.time())
            return _cast(exp.Literal.string(value.isoformat(sep=" ")), t)
        if t.name == "timestamptz":
            assert isinstance(value, datetime.datetime)
            return _cast(exp.Literal.string(value.isoformat(sep=" ")), t)
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
            tests: list[exp.Expr] = [exp.Is(this=_operand(self.value(f)), expression=exp.Null()) for f in fields]
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
        test = exp.Is(this=_operand(inner), expression=exp.Null())  # Spark cannot parse x LIKE y IS NULL
        return exp.Not(this=exp.Paren(this=test)) if negate else test

    # --- comparisons ------------------------------------------------------------------------------
    def _compared(self, node: exp.Expr) -> exp.Expr:
        """An operand as a comparison sees it: character(n) compares without trailing spaces
        (bpchareq, bpcharlt … use bcTruelen), while its value keeps the padding PostgreSQL stores."""
        built = self.value(node)
        if self.rf.targets.get(id(node), self.rf.types[id(node)]).name == "bpchar":
            return _fn("rtrim", built)
        return _operand(built)

    def _cmp(self, cls, node):
        quantified = quantified_array(node.right)
        if quantified is not None:
            kind, array = quantified
            if isinstance(array, exp.Column):
                return self._quantified_column(cls, node, kind, array)
            assert isinstance(array, exp.Array), "the analysis refuses ANY/ALL over anything but ARRAY[…] or a column"
            return self._quantified(cls, node, kind, array)
        return cls(this=self._compared(node.left), expression=self._compared(node.right))

    def _quantified(self, cls, node, kind: str, array: exp.Array) -> exp.Expr:
        """x op ANY/ALL (ARRAY[…]): each element in the array's type, then in the operator's, ORed (ANY) or
        ANDed (ALL); ScalarArrayOpExpr's NULL rules are those of OR and AND."""
        element, common = self.rf.types[id(array)], self.rf.targets[id(array)]
        left = self._compared(node.left)
        terms = []
        for e in array.expressions:
            item = self.convert(self.value(e), element, common)
            item = _fn("rtrim", item) if common.name == "bpchar" else _operand(item)
            terms.append(cls(this=left.copy(), expression=item))
        if cls is exp.EQ and kind == "any":  # what x IN (…) gives too: one Spark text for both spellings
            return exp.In(this=left, expressions=[term.expression for term in terms])
        return exp.Paren(this=exp.or_(*terms) if kind == "any" else exp.and_(*terms))

    def _quantified_column(self, cls, node, kind: str, array: exp.Column) -> exp.Expr:
        """x op ANY/ALL (array_column): ``exists`` (ANY) or ``forall`` (ALL) of the comparison with each element,
        which keep ScalarArrayOpExpr's NULL rules (a match is true, else NULL if an element or x is NULL; an
        empty array is false for ANY, true for ALL; a NULL array is NULL)."""
        element, common = self.rf.types[id(array)].element, self.rf.targets[id(array)].element
        assert element is not None and common is not None  # the analysis types an array column so
        item = self.convert(_LAMBDA_ELEMENT.copy(), element, common)
        item = _fn("rtrim", item) if common.name == "bpchar" else _operand(item)
        test = cls(this=_LAMBDA_SCALAR.copy(), expression=item)
        quantified = _fn("exists" if kind == "any" else "forall", self.value(array),
                         exp.Lambda(this=test, expressions=[_LAMBDA_ELEMENT.copy()]))
        # x is evaluated once, whatever the array holds, as ExecEvalScalarArrayOp has it evaluated before it looks
        # at the array (an error of x, an overflow, is raised for an empty or NULL array too): bound by a lambda over
        # a one-element array, whose exists() is the inner result itself (true, false or NULL).
        return _fn("exists", exp.Array(expressions=[self._compared(node.left)]),
                   exp.Lambda(this=quantified, expressions=[_LAMBDA_SCALAR.copy()]))

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
        return _fn("rtrim", built) if common.name == "bpchar" else _operand(built)

    # --- arithmetic -------------------------------------------------------------------------------
    def _arith(self, cls, node, t):
        left, right = self.value(node.left), self.value(node.right)
        lt = self.rf.types[id(node.left)]
        if lt.name == "date":
            rt = self.rf.types[id(node.right)]
            if rt.name == "date":
                return _fn("datediff", left, right)
            return _checked_date(cls, left, right)
        result = _cast(cls(this=exp.Paren(this=left), expression=exp.Paren(this=right)), t)
        if t.name in ("float4", "float8"):
            return _checked_float(cls, left, right, result, t)
        return result

    def _t_Add(self, node, t): return self._arith(exp.Add, node, t)
    def _t_Sub(self, node, t): return self._arith(exp.Sub, node, t)
    def _t_Mul(self, node, t): return self._arith(exp.Mul, node, t)
    def _t_Mod(self, node, t): return self._arith(exp.Mod, node, t)

    def _t_Div(self, node, t):
        if t.is_integer:  # PostgreSQL's integer division truncates toward zero, as Spark's DIV does
            return _cast(exp.IntDiv(this=exp.Paren(this=self.value(node.left)),
                                    expression=exp.Paren(this=self.value(node.right))), t)
        return self._arith(exp.Div, node, t)

    def _t_Neg(self, node, t):
        return exp.Neg(this=exp.Paren(this=self.value(node.this)))

    def _t_DPipe(self, node, t):
        return _fn("concat", self.value(node.left), self.value(node.right))

    # --- patterns ---------------------------------------------------------------------------------
    def _t_Like(self, node, t, *, escape: str | None = None, fold: bool = False):
        quantified = quantified_array(node.right)
        if quantified is not None:
            # x LIKE ANY/ALL (ARRAY[…]): the operator on each element, ORed (ANY) or ANDed (ALL), which are
            # ScalarArrayOpExpr's NULL rules; NOT LIKE is the operator !~~ on each element
            kind, array = quantified
            terms = [self._like(node, self.value(node.left), e, escape, fold) for e in array.expressions]
            return exp.Paren(this=exp.or_(*terms) if kind == "any" else exp.and_(*terms))
        return self._like(node, self.value(node.left), node.right, escape, fold)

    def _like(self, node, subject: exp.Expr, pattern_node: exp.Expr, escape: str | None, fold: bool) -> exp.Expr:
        pattern: exp.Expr
        if id(pattern_node) in self.rf.constants and self.rf.constants[id(pattern_node)] is not None:
            pattern = exp.Literal.string(_like_pattern(str(self.rf.constants[id(pattern_node)]), escape))
        elif escape in (None, "\\"):
            pattern = _like_escapes(self.value(pattern_node))
        else:
            raise UntranslatableFilterError("LIKE with a non-constant pattern and a custom ESCAPE")
        if fold:
            subject, pattern = self._ascii_lower(subject), self._ascii_lower(pattern)
        like = exp.Like(this=subject, expression=pattern)
        return exp.Not(this=exp.Paren(this=like)) if node.args.get("negate") else like

    def _t_ILike(self, node, t):
        return self._t_Like(node, t, fold=True)

    # --- regular expressions (core/filters/regex.py) ------------------------------------------------
    def _regex(self, node, t, test: exp.Expr) -> exp.Expr:
        pattern, error = regex_of(self.rf, node)
        subject = self.value(test.this)
        if error is not None:  # PostgreSQL raises when it compiles the pattern, for a non-NULL subject
            return exp.Case(ifs=[exp.If(this=exp.Is(this=_operand(subject), expression=exp.Null()),
                                        true=_cast(exp.Null(), T.BOOL))], default=_raise(error))
        if pattern is None:
            return _cast(exp.Null(), T.BOOL)
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

    @staticmethod
    def _ascii_lower(e: exp.Expr) -> exp.Expr:
        return _fn("translate", e, exp.Literal.string(_UPPER), exp.Literal.string(_LOWER))

    # --- conditionals -----------------------------------------------------------------------------
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
            return exp.Case(ifs=[exp.If(this=equal, true=_cast(exp.Null(), t))], default=self.value(node.this))
        compared = self.rf.targets.get(id(node.this), self.rf.types[id(node.this)])
        value = exp.Nullif(this=self.value(node.this), expression=self.value(node.expression))
        # compared in the common type, returned in the first argument's (core/filters: _a_Nullif)
        return value if compared == t else _cast(value, t)

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
                    left = _fn("rtrim", left)
                cond: exp.Expr = exp.EQ(this=left, expression=right)
            else:
                cond = self.value(branch.this)
            ifs.append(exp.If(this=cond, true=self.value(branch.args["true"])))
        default = node.args.get("default")
        return exp.Case(ifs=ifs, default=self.value(default) if default is not None else _cast(exp.Null(), t))

    def _t_Collate(self, node, t):
        return self.value(node.this)

    def _t_Cast(self, node, t):
        inner = self.rf.types[id(node.this)]
        built = self.convert(self.value(node.this), inner, t)
        if t.is_text_family and t.precision is not None and inner != t:
            # An explicit cast to varchar(n) truncates silently; character(n) truncates and pads.
            n = exp.Literal.number(t.precision)
            if t.name == "bpchar":
                return _fn("rpad", built, n, exp.Literal.string(" "))
            return _fn("substring", built, exp.Literal.number(1), n)
        return built

    # --- functions --------------------------------------------------------------------------------
    def _arg(self, node: exp.Expr, i: int) -> exp.Expr:
        return self.value(list(node.iter_expressions())[i])

    def _f_lower(self, node, t): return self._ascii_lower(self._arg(node, 0))

    def _f_upper(self, node, t):
        return _fn("translate", self._arg(node, 0), exp.Literal.string(_LOWER), exp.Literal.string(_UPPER))

    def _f_btrim(self, node, t): return _fn("trim", self._arg(node, 0))
    def _f_ltrim(self, node, t): return _fn("ltrim", self._arg(node, 0))
    def _f_rtrim(self, node, t): return _fn("rtrim", self._arg(node, 0))

    def _f_length(self, node, t):
        arg = list(node.iter_expressions())[0]
        value = self.value(arg)
        if self.rf.types[id(arg)].name == "bpchar":  # length(character) ignores trailing spaces
            value = _fn("rtrim", value)
        return _fn("char_length", value)

    def _f_abs(self, node, t): return _cast(_fn("abs", self._arg(node, 0)), t)

    def _f_mod(self, node, t):
        return _cast(exp.Mod(this=exp.Paren(this=self._arg(node, 0)), expression=exp.Paren(this=self._arg(node, 1))), t)

    # substr/substring, left, right, strpos/position, split_part, repeat (varlena.c), with PostgreSQL's
    # rules for zero, negative and NULL arguments; Spark's string functions count characters, as
    # PostgreSQL's do.
    def _strict(self, node, t, result: exp.Expr) -> exp.Expr:
        """NULL when any argument is NULL (the functions are strict): Spark's greatest() skips NULLs."""
        nulls = [exp.Is(this=_operand(self.value(a)), expression=exp.Null()) for a in node.iter_expressions()]
        return exp.Case(ifs=[exp.If(this=exp.or_(*nulls), true=_cast(exp.Null(), t))], default=result)

    def _f_substring(self, node, t):
        args = list(node.iter_expressions())
        s, start = self.value(args[0]), self.value(args[1])
        first = exp.Greatest(this=start, expressions=[exp.Literal.number(1)])
        if len(args) == 2:  # text_substr_no_len: from max(start, 1) to the end (greatest() skips a NULL)
            return self._strict(node, t, _fn("substring", s, first))
        length = self.value(args[2])
        # text_substring: characters [max(S, 1), S + L), nothing when S + L <= 1, computed without overflow
        end = exp.Add(this=_cast(start.copy(), PgType("int8")), expression=_operand(length))
        count = exp.Least(this=exp.Greatest(this=exp.Sub(this=end, expression=first.copy()),
                                            expressions=[exp.Literal.number(0)]),
                          expressions=[exp.Literal.number(2147483647)])
        negative = exp.LT(this=_operand(length.copy()), expression=exp.Literal.number(0))
        result = exp.Case(ifs=[exp.If(this=negative, true=_raise("negative substring length not allowed"))],
                          default=_fn("substring", s, first.copy(), _cast(count, T.INT4)))
        return self._strict(node, t, result)

    def _f_left(self, node, t):
        s, n = self._arg(node, 0), self._arg(node, 1)
        # text_left: the first n characters; n < 0: all but the last |n|
        count = exp.Case(ifs=[exp.If(this=exp.GTE(this=_operand(n), expression=exp.Literal.number(0)), true=n.copy())],
                         default=exp.Greatest(this=exp.Add(this=_fn("char_length", s), expression=_operand(n.copy())),
                                              expressions=[exp.Literal.number(0)]))
        return self._strict(node, t, _fn("substring", s.copy(), exp.Literal.number(1), count))

    def _f_right(self, node, t):
        s, n = self._arg(node, 0), self._arg(node, 1)
        # text_right: the last n characters; n < 0: all but the first |n|. For n = INT_MIN, -n
        # overflows back to INT_MIN and pg_mbcharcliplen keeps the whole string (as PostgreSQL 15 to 18 do).
        length = _fn("char_length", s)
        skipped = exp.Case(
            ifs=[exp.If(this=exp.EQ(this=_operand(n), expression=exp.Literal.number(-2147483648)),
                        true=exp.Literal.number(0)),
                 exp.If(this=exp.GTE(this=_operand(n.copy()), expression=exp.Literal.number(0)),
                        true=exp.Greatest(this=exp.Sub(this=length, expression=_operand(n.copy())),
                                          expressions=[exp.Literal.number(0)]))],
            default=exp.Least(this=exp.Neg(this=exp.Paren(this=n.copy())), expressions=[length.copy()]))
        start = exp.Add(this=exp.Paren(this=skipped), expression=exp.Literal.number(1))
        return self._strict(node, t, _fn("substring", s.copy(), start))

    def _f_position(self, node, t):
        # strpos(s, sub) / position(sub IN s): 1-based, 0 when absent, 1 for an empty sub (text_position)
        return _fn("instr", self._arg(node, 0), self._arg(node, 1))

    def _f_split_part(self, node, t):
        n = self._arg(node, 2)
        zero = exp.EQ(this=_operand(n), expression=exp.Literal.number(0))
        # Spark's split_part negates the index and fails for INT_MIN; PostgreSQL finds no such field: ''
        int_min = exp.EQ(this=_operand(n.copy()), expression=exp.Literal.number(-2147483648))
        result = exp.Case(ifs=[exp.If(this=zero, true=_raise("field position must not be zero")),
                               exp.If(this=int_min, true=exp.Literal.string(""))],
                          default=_fn("split_part", self._arg(node, 0), self._arg(node, 1), n.copy()))
        return self._strict(node, t, result)

    def _f_repeat(self, node, t):
        s, n = self._arg(node, 0), self._arg(node, 1)
        # repeat: a negative count is 0; a result over MaxAllocSize (with its 4-byte header) is an error
        size = exp.Add(this=exp.Mul(this=_cast(_fn("octet_length", s), PgType("int8")),
                                    expression=exp.Greatest(this=n, expressions=[exp.Literal.number(0)])),
                       expression=exp.Literal.number(4))
        too_large = exp.GT(this=size, expression=exp.Literal.number(1073741823))
        result = exp.Case(ifs=[exp.If(this=too_large, true=_raise("requested length too large"))],
                          default=_fn("repeat", s.copy(), n.copy()))
        return self._strict(node, t, result)

    def _f_starts_with(self, node, t): return _fn("startswith", self._arg(node, 0), self._arg(node, 1))
    def _f_replace(self, node, t): return _fn("replace", self._arg(node, 0), self._arg(node, 1), self._arg(node, 2))

    def _f_round(self, node, t):
        args = list(node.iter_expressions())
        if t.name == "float8":
            return _fn("bround", self.value(args[0]), exp.Literal.number(0))
        digits = self.value(args[1]) if len(args) > 1 else exp.Literal.number(0)
        return _cast(_fn("round", self.value(args[0]), digits), t)


def _raise(message: str) -> exp.Expr:
    return _fn("raise_error", exp.Literal.string(message))


def _checked_float(cls, left: exp.Expr, right: exp.Expr, result: exp.Expr,
                   t: PgType) -> exp.Expr:
    """PostgreSQL's float arithmetic with its errors (float.h); Spark yields Infinity or 0 instead.

    ``float8_pl``/``_mi``/``_mul``/``_div`` raise "value out of range: overflow" when the result
    is infinite but no input was, ``_mul``/``_div`` raise "underflow" when the result is 0 but the
    inputs were not (nor, for division, an infinite divisor), and ``_div`` raises "division by
    zero" for a zero divisor unless the dividend is NaN (NaN / 0 is NaN). Spark's ANSI division
    raises for every zero divisor, so NaN / 0 is answered before dividing.
    """
    infinity = _cast(exp.Literal.string("Infinity"), t)
    zero = _cast(exp.Literal.number(0), t)

    def is_inf(e: exp.Expr) -> exp.Expr:
        return exp.EQ(this=_fn("abs", e.copy()), expression=infinity.copy())

    def is_zero(e: exp.Expr) -> exp.Expr:
        return exp.EQ(this=e.copy(), expression=zero.copy())

    def all_of(*conds: exp.Expr) -> exp.Expr:
        return exp.and_(*(exp.Paren(this=c) for c in conds))

    def no(cond: exp.Expr) -> exp.Expr:
        return exp.Not(this=exp.Paren(this=cond))

    underflow: exp.Expr | None
    if cls is exp.Div:
        overflow = all_of(is_inf(result), no(is_inf(left)))
        underflow = all_of(is_zero(result), no(is_zero(left)), no(is_inf(right)))
    else:
        overflow = all_of(is_inf(result), no(is_inf(left)), no(is_inf(right)))
        underflow = (all_of(is_zero(result), no(is_zero(left)), no(is_zero(right)))
                     if cls is exp.Mul else None)
    ifs = [exp.If(this=overflow, true=_raise("value out of range: overflow"))]
    if underflow is not None:
        ifs.append(exp.If(this=underflow, true=_raise("value out of range: underflow")))
    checked: exp.Expr = exp.Case(ifs=ifs, default=result)
    if cls is exp.Div:
        nan_by_zero = all_of(is_zero(right), _fn("isnan", left.copy()))
        checked = exp.Case(ifs=[exp.If(this=nan_by_zero, true=left.copy())], default=checked)
    return checked


def _checked_float4(value: exp.Expr, result: exp.Expr) -> exp.Expr:
    """float8 → real raises "value out of range: overflow/underflow" in PostgreSQL (float84)."""
    infinity = _cast(exp.Literal.string("Infinity"), PgType("float8"))

    def is_inf(e: exp.Expr) -> exp.Expr:
        return exp.EQ(this=_fn("abs", _cast(e.copy(), PgType("float8"))), expression=infinity.copy())

    def is_zero(e: exp.Expr) -> exp.Expr:
        return exp.EQ(this=e.copy(), expression=exp.Literal.number(0))

    overflow = exp.and_(exp.Paren(this=is_inf(result)), exp.Not(this=exp.Paren(this=is_inf(value))))
    underflow = exp.and_(exp.Paren(this=is_zero(result)), exp.Not(this=exp.Paren(this=is_zero(value))))
    return exp.Case(ifs=[exp.If(this=overflow, true=_raise("value out of range: overflow")),
                         exp.If(this=underflow, true=_raise("value out of range: underflow"))],
                    default=result)


# PostgreSQL's dates run from 4714-11-24 BC to 5874897-12-31 (IS_VALID_DATE), as days since 1970-01-01.
_MIN_UNIX_DATE, _MAX_UNIX_DATE = -2440588, 2145042905


def _checked_date(cls, date: exp.Expr, days: exp.Expr) -> exp.Expr:
    """date ± integer raises "date out of range" in PostgreSQL (date_pli, date_mii); Spark's date_add does
    not, and its int arithmetic wraps. The range is checked on the exact sum, in bigint."""
    exact = cls(this=_fn("unix_date", date.copy()), expression=exp.Cast(this=days.copy(), to=exp.DataType.build("bigint")))
    outside = exp.Not(this=exp.Paren(this=exp.Between(this=exact, low=exp.Literal.number(_MIN_UNIX_DATE),
                                                      high=exp.Literal.number(_MAX_UNIX_DATE))))
    result = _fn("date_add" if cls is exp.Add else "date_sub", date, days)
    return exp.Case(ifs=[exp.If(this=outside, true=_raise("date out of range"))], default=result)


_LIKE_SPECIAL = re.compile(r"[%_\\]")


def _like_escapes(pattern: exp.Expr) -> exp.Expr:
    """A LIKE pattern computed per row, with PostgreSQL's backslash escapes made Spark's: PostgreSQL takes
    any character after a backslash for itself, Spark only ``%``, ``_`` and a backslash (it raises at any
    other). Left to right, an escape with one of those stays, any other loses its backslash; a trailing
    backslash stays, and both raise there (PostgreSQL where the match reaches it)."""
    return _fn("regexp_replace", pattern, exp.Literal.string(r"(?s)(\\[\\%_])|\\(.)"), exp.Literal.string("$1$2"))


def _like_pattern(pattern: str, escape: str | None) -> str:
    """Rewrite a PostgreSQL LIKE pattern for Spark's LIKE (whose escape character is backslash).

    PostgreSQL lets the escape character precede any character (it then stands for itself);
    Spark only accepts it before ``%``, ``_`` and itself.
    """
    escape = "\\" if escape is None else escape
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape and ch == escape:
            if i + 1 == len(pattern):
                raise UntranslatableFilterError("LIKE pattern must not end with escape character")
            nxt = pattern[i + 1]
            out.append("\\" + nxt if _LIKE_SPECIAL.match(nxt) else nxt)
            i += 2
            continue
        out.append("\\\\" if ch == "\\" else ch)
        i += 1
    return "".join(out)
