"""Row filters in Spark: rows and arrays, with PostgreSQL's NULL rules and evaluation order.

A mixin of core/filters/spark_translation.py's translator: row comparisons (parse_expr.c
``make_row_comparison_op``, ``make_row_distinct_op``; RowCompareExpr as the executor runs it), ``x op ANY/ALL``
over ARRAY[…], an array column or an array constant (ScalarArrayOpExpr), and ``@>``, ``<@``, ``&&``
(array.c ``array_contain_compare``), rendered with Spark's ``exists``/``forall`` where an array is a value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_provider_rowfilter.core.errors import UntranslatableFilterError
from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.grammar import row_fields
from airflow_provider_rowfilter.core.filters.spark_sql import (
    LAMBDA_ELEMENT,
    LAMBDA_SCALAR,
    cast,
    fn,
    operand,
    raise_error,
)


def _holding(left: T.PgType, right: T.PgType) -> T.PgType:
    """The numeric(p,s) that holds two numeric types' values, or the refusal when Spark's DECIMAL cannot."""
    common = T.numeric_holding(left, right)
    if common.precision is None or common.precision > T.SPARK_MAX_DECIMAL_PRECISION:
        raise UntranslatableFilterError(f"comparing {left} with {right} in one numeric of at most "
                                        f"{T.SPARK_MAX_DECIMAL_PRECISION} digits",
                                        hint="cast one side to the other's numeric(p,s) in the filter")
    return common


if TYPE_CHECKING:  # the translator this mixin is part of (core/filters/spark_translation.py ``_Translator``)
    _Translator = Any
else:
    _Translator = object


class CompositeTranslation(_Translator):
    """Renderers of core/filters/spark_translation.py's translator for rows and arrays (a mixin: ``self`` is that
    translator)."""

    def _row_comparison(self, cls, left: list[exp.Expr], right: list[exp.Expr]) -> exp.Expr:
        """``(a, b) op (c, d)`` as PostgreSQL builds it (parse_expr.c make_row_comparison_op, make_row_distinct_op):
        ``=`` and ``IS NOT DISTINCT FROM`` are the AND of the pairs' operators, ``<>`` their OR (plain boolean
        expressions, with AND's and OR's NULL rules); ``< <= > >=`` is a RowCompareExpr, which ExecEvalRowCompare
        runs pair by pair: NULL at the first pair holding a NULL, the pair's operator at the first pair that
        differs, the last pair's operator when all are equal (so ``(1, 2) <= (1, 2)`` is true, ``(1, NULL) < (2,
        0)`` true, ``(1, NULL) < (1, 0)`` NULL)."""
        pairs = [(self._compared(a), self._compared(b)) for a, b in zip(left, right, strict=True)]
        if cls in (exp.EQ, exp.NullSafeEQ):
            return exp.Paren(this=exp.and_(*(cls(this=a, expression=b) for a, b in pairs)))
        if cls is exp.NEQ:
            return exp.Paren(this=exp.or_(*(cls(this=a, expression=b) for a, b in pairs)))
        *leading, (last_a, last_b) = pairs
        ifs = []
        for a, b in leading:
            # both fields are evaluated before the NULL test, as the executor evaluates them (an OR would skip
            # the right one's errors when the left one is NULL)
            either_null = exp.EQ(this=exp.BitwiseOr(this=cast(exp.Is(this=a, expression=exp.Null()), T.INT4),
                                                    expression=cast(exp.Is(this=b, expression=exp.Null()), T.INT4)),
                                 expression=exp.Literal.number(1))
            ifs.append(exp.If(this=either_null, true=cast(exp.Null(), T.BOOL)))
            ifs.append(exp.If(this=exp.NEQ(this=a.copy(), expression=b.copy()),
                              true=cls(this=a.copy(), expression=b.copy())))
        return exp.Case(ifs=ifs, default=cls(this=last_a, expression=last_b)) if ifs \
            else cls(this=last_a, expression=last_b)

    def _row_quantified(self, cls, node, kind: str, array: exp.Expr) -> exp.Expr:
        """``(a, b) = ANY/ALL (ARRAY[ROW(…), …])`` (``<>``: record_ne, NOT record_eq): record_eq (rowtypes.c) on each
        element, ORed (ANY: ExecEvalScalarArrayOp stops at the first true) or ANDed (ALL: at the first false); it is
        never NULL. Field by field, in order: two fields of different types raise ``cannot compare dissimilar column
        types``, an ``unknown`` one ``could not identify an equality operator``; two NULLs are equal, one NULL is
        unequal, else the type's ``=``; the first unequal field ends it (false), before later fields are checked;
        all equal over rows of different lengths raise ``cannot compare record types with different numbers of
        columns``."""
        left = row_fields(node.left) or []
        terms = []
        for element in array.expressions:
            right = row_fields(element) or []
            result: exp.Expr = exp.true() if len(left) == len(right) else raise_error(
                "cannot compare record types with different numbers of columns")
            for i in reversed(range(min(len(left), len(right)))):
                lt, rt = self.rf.types[id(left[i])], self.rf.types[id(right[i])]
                if lt.name != rt.name:
                    result = raise_error(f"cannot compare dissimilar column types {lt} and {rt} at record column "
                                         f"{i + 1}")
                    continue
                if lt.is_unknown:
                    result = raise_error("could not identify an equality operator for type unknown")
                    continue
                a, b = self.value(left[i]), self.value(right[i])
                if lt.name == "numeric" and lt != rt:  # numeric_eq across typmods: both in one Spark struct
                    common = _holding(lt, rt)
                    a, b = self.convert(a, lt, common), self.convert(b, rt, common)
                if lt.name == "bpchar":  # bpchareq: without trailing spaces
                    a, b = fn("rtrim", a), fn("rtrim", b)
                # two NULLs equal, one NULL unequal, else the type's =: Spark's null-safe <=>
                result = exp.Case(ifs=[exp.If(this=exp.NullSafeEQ(this=operand(a), expression=operand(b)),
                                              true=result)], default=exp.false())
            if not isinstance(result, (exp.Case, exp.Boolean)):
                # a bare raise_error is of Spark's NULL type: Spark's optimizer reduced raise_error(…) AND
                # raise_error(…) to NULL without raising (found by the differential test); typed, it raises
                result = cast(result, T.BOOL)
            terms.append(exp.Not(this=exp.Paren(this=result)) if cls is exp.NEQ else exp.Paren(this=result))
        return exp.Paren(this=exp.or_(*terms) if kind == "any" else exp.and_(*terms))

    def _quantified(self, cls, node, kind: str, array: exp.Array) -> exp.Expr:
        """x op ANY/ALL (ARRAY[…]): each element in the array's type, then in the operator's, ORed (ANY) or
        ANDed (ALL); ScalarArrayOpExpr's NULL rules are those of OR and AND."""
        element, common = self.rf.types[id(array)], self.rf.targets[id(array)]
        left = self._compared(node.left)
        terms = []
        for e in array.expressions:
            item = self.convert(self.value(e), element, common)
            item = fn("rtrim", item) if common.name == "bpchar" else operand(item)
            terms.append(cls(this=left.copy(), expression=item))
        if cls is exp.EQ and kind == "any":  # what x IN (…) gives too: one Spark text for both spellings
            return exp.In(this=left, expressions=[term.expression for term in terms])
        return exp.Paren(this=exp.or_(*terms) if kind == "any" else exp.and_(*terms))

    def _quantified_column(self, cls, node, kind: str, array: exp.Expr) -> exp.Expr:
        """x op ANY/ALL (array_column or array constant): ``exists`` (ANY) or ``forall`` (ALL) of the comparison with
        each element, which keep ScalarArrayOpExpr's NULL rules (a match is true, else NULL if an element or x is
        NULL; an empty array is false for ANY, true for ALL; a NULL array is NULL)."""
        element = self.rf.types[id(array)].element
        common = self.rf.targets.get(id(array), self.rf.types[id(array)]).element
        assert element is not None and common is not None  # the analysis types an array column or constant so
        item = self.convert(LAMBDA_ELEMENT.copy(), element, common)
        item = fn("rtrim", item) if common.name == "bpchar" else operand(item)
        test = cls(this=LAMBDA_SCALAR.copy(), expression=item)
        return self._each_element(kind, array, test, self._compared(node.left))

    def _array_value(self, array: exp.Expr) -> exp.Expr:
        """An array column's value, or an array constant in its own element type (array_in read it so)."""
        if id(array) in self.rf.constants:
            return self.constant(self.rf.constants[id(array)], self.rf.types[id(array)])
        return self.value(array)

    def _array_operand(self, array: exp.Expr) -> exp.Expr:
        """An operand of ``@>``/``<@``/``&&``: ARRAY[…] as a Spark array of its elements' type, a column or a
        constant as under ANY/ALL."""
        if isinstance(array, exp.Array):
            return cast(exp.Array(expressions=[self.value(e) for e in array.expressions]), self.rf.types[id(array)])
        return self._array_value(array)

    def _contained(self, node, sub: exp.Expr, sup: exp.Expr, every: bool) -> exp.Expr:
        """Every (``every``) or some element of ``sub`` equal to an element of ``sup`` (array.c
        ``array_contain_compare``: a NULL element matches nothing, so the result is true or false; NULL when an
        array is NULL, both arrays being evaluated first, as a strict function's arguments are)."""
        element = self.rf.types[id(node.this)].element
        assert element is not None
        a, b = self._array_operand(sub), self._array_operand(sup)
        if element.name == "numeric":  # numeric_eq across typmods: both arrays of one Spark struct
            sub_type, sup_type = (self.rf.types[id(x)].element for x in (sub, sup))
            assert sub_type is not None and sup_type is not None
            if sub_type != sup_type:
                common = T.PgType("_array", element=_holding(sub_type, sup_type))
                a, b = cast(a, common), cast(b, common)

        def compared(e: exp.Expr) -> exp.Expr:
            return fn("rtrim", e) if element.name == "bpchar" else e
        match = exp.EQ(this=compared(LAMBDA_ELEMENT.copy()), expression=compared(LAMBDA_SCALAR.copy()))
        found = exp.Coalesce(this=fn("exists", b, exp.Lambda(this=match, expressions=[LAMBDA_ELEMENT.copy()])),
                             expressions=[exp.false()])
        test = exp.and_(exp.Not(this=exp.Paren(this=exp.Is(this=LAMBDA_SCALAR.copy(), expression=exp.Null()))), found)
        quantified = fn("forall" if every else "exists", a, exp.Lambda(this=test, expressions=[LAMBDA_SCALAR.copy()]))
        either_null = exp.EQ(this=exp.BitwiseOr(this=cast(exp.Is(this=a.copy(), expression=exp.Null()), T.INT4),
                                                expression=cast(exp.Is(this=b.copy(), expression=exp.Null()), T.INT4)),
                             expression=exp.Literal.number(1))
        return exp.Case(ifs=[exp.If(this=either_null, true=cast(exp.Null(), T.BOOL))], default=quantified)

    def _t_ArrayContainsAll(self, node, t):  # a @> b: every element of b is in a
        return self._contained(node, node.expression, node.this, every=True)

    def _t_ArrayContainedBy(self, node, t):  # a <@ b: every element of a is in b
        return self._contained(node, node.this, node.expression, every=True)

    def _t_ArrayOverlaps(self, node, t):  # a && b: some element of a is in b
        return self._contained(node, node.this, node.expression, every=False)

    def _each_element(self, kind: str, array: exp.Expr, test: exp.Expr, subject: exp.Expr) -> exp.Expr:
        """``test`` (over LAMBDA_SCALAR, bound to ``subject``, and LAMBDA_ELEMENT) for some (ANY) or every (ALL)
        element of ``array``."""
        quantified = fn("exists" if kind == "any" else "forall", self._array_value(array),
                        exp.Lambda(this=test, expressions=[LAMBDA_ELEMENT.copy()]))
        # x is evaluated once, whatever the array holds, as ExecEvalScalarArrayOp has it evaluated before it looks
        # at the array (an error of x, an overflow, is raised for an empty or NULL array too): bound by a lambda over
        # a one-element array, whose exists() is the inner result itself (true, false or NULL).
        return fn("exists", exp.Array(expressions=[subject]),
                  exp.Lambda(this=quantified, expressions=[LAMBDA_SCALAR.copy()]))
