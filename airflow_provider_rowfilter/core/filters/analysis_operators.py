"""Row filters, semantics of arithmetic, concatenation, the pattern operators and COLLATE.

A mixin of core/filters/analysis.py's analyzer (same attributes: ``types``, ``targets``, ``constants``,
``collations``, ``context``): it types ``+ - * / %`` and unary minus as PostgreSQL's operator resolution
does (parse_oper.c; numeric result precision and scale as numeric.c computes them), ``||`` (textcat,
or the STABLE textanycat), ``LIKE``/``ILIKE``/``SIMILAR TO`` [``ESCAPE``] and ``COLLATE`` (parse_expr.c
``transformCollateClause``), and refuses what Spark cannot evaluate exactly (numeric division, results
past Spark's 38 digits, case mapping under a linguistic collation).
"""

from __future__ import annotations

import decimal
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.constants import decimal_type, numeric_input
from airflow_provider_rowfilter.core.filters.grammar import MUTABLE, ONLY_SIMPLE, USER_COLLATION
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.text import quantified_array

if TYPE_CHECKING:  # the analyzer this mixin is part of (core/filters/analysis.py ``_Analyzer``)
    _Analyzer = Any
else:
    _Analyzer = object


def _infinite(constant: object) -> bool:
    """Whether a constant is (or an untyped literal reads as) numeric's Infinity or -Infinity."""
    if isinstance(constant, str):
        try:
            constant = numeric_input(constant)
        except (ValueError, decimal.InvalidOperation):
            return False
    return isinstance(constant, decimal.Decimal) and constant.is_infinite()


class OperatorAnalysis(_Analyzer):
    """Handlers of core/filters/analysis.py's analyzer for arithmetic, ``||``, patterns and COLLATE (a mixin:
    ``self`` is that analyzer)."""

    def _arith(self, node: exp.Binary, op: str) -> PgType:
        lt, rt = self.analyze(node.left), self.analyze(node.right)
        if lt.name == "date" and op in "+-" and (rt.is_integer or rt.is_unknown):
            self.coerce(node.right, rt, T.INT4)
            return T.DATE
        if lt.name == "date" and rt.name == "date" and op == "-":
            return T.INT4
        lt_ = T.INT4 if lt.is_unknown else lt
        rt_ = T.INT4 if rt.is_unknown else rt
        common = T.numeric_common(lt_, rt_)
        if common is None:
            raise self.error(f"operator does not exist: {lt} {op} {rt}", node,
                             hint="No operator matches the given name and argument types. "
                             "You might need to add explicit type casts.")
        if op == "%" and common.name in ("float4", "float8"):
            raise self.error(f"operator does not exist: {lt} % {rt}", node)
        if common.name == "numeric":
            lt_, rt_ = self._numeric_operand(node.left, lt, lt_), self._numeric_operand(node.right, rt, rt_)
            common = self._numeric_arith(lt_, rt_, op, node)
        self.coerce(node.left, lt, common if common.name != "numeric" else lt_)
        self.coerce(node.right, rt, common if common.name != "numeric" else rt_)
        return common

    def _numeric_operand(self, child: exp.Expr, t: PgType, resolved: PgType) -> PgType:
        """An untyped literal beside a numeric is a numeric (an unknown operand takes the other one's type:
        parse_oper.c oper_select_candidate), typed by its own digits (``n + 'Infinity'``, ``n * '1.25'``)."""
        if not t.is_unknown or self.constants.get(id(child)) is None:
            return resolved
        value = self.literal_value(child, self.constants[id(child)], T.NUMERIC)
        assert isinstance(value, decimal.Decimal)
        return decimal_type(value)

    def _numeric_arith(self, lt: PgType, rt: PgType, op: str, node: exp.Expr) -> PgType:
        if op == "/":
            raise self.untranslatable(
                "numeric division", node,
                "PostgreSQL picks the result scale of numeric division from the values; multiply instead "
                "(a > 2 * b rather than a / b > 2), or divide as double precision (a::float8 / b)")
        def ps(t: PgType) -> tuple[int, int]:
            if t.name == "numeric":
                if t.precision is None:
                    raise self.untranslatable("numeric without a precision", node,
                                              "declare the column numeric(p,s) with p <= 38")
                return t.precision, t.scale or 0
            return {"int2": 5, "int4": 10, "int8": 19}[t.name], 0
        (p1, s1), (p2, s2) = ps(lt), ps(rt)
        if op in "+-":
            scale = max(s1, s2)
            precision = max(p1 - s1, p2 - s2) + scale + 1
        elif op == "*":
            scale, precision = s1 + s2, p1 + p2 + 1
        else:  # %: |a % b| < |b|, but a % ±Infinity is a (numeric_mod), and only a constant can be infinite
            scale = max(s1, s2)
            divisor = node.right if isinstance(node, exp.Binary) else list(node.iter_expressions())[1]
            infinite = any(_infinite(self.constants.get(id(n))) for n in divisor.walk())
            precision = (p1 - s1 if infinite else min(p1 - s1, p2 - s2)) + scale
        if precision > T.SPARK_MAX_DECIMAL_PRECISION:
            raise self.untranslatable(
                f"numeric arithmetic needing {precision} digits", node,
                "Spark's decimal holds 38 digits; use narrower numeric(p,s) columns or compare without arithmetic")
        return PgType("numeric", precision, scale)

    def _a_Add(self, node): return self._arith(node, "+")
    def _a_Sub(self, node): return self._arith(node, "-")
    def _a_Mul(self, node): return self._arith(node, "*")
    def _a_Mod(self, node): return self._arith(node, "%")

    def _a_Div(self, node: exp.Div) -> PgType:
        return self._arith(node, "/")

    def _a_Neg(self, node: exp.Neg) -> PgType:
        t = self.analyze(node.this)
        # The parser folds a minus sign into a numeric literal (gram.y doNegate); anything else, even
        # a typed constant such as '-32768'::smallint, is negated by the type's operator when the
        # filter runs (int2um raises "smallint out of range" there).
        if isinstance(node.this, exp.Literal) and not node.this.is_string:
            constant = self.constants[id(node.this)]
            assert isinstance(constant, (int, decimal.Decimal)), constant  # what _a_Literal keeps of a number
            value = -constant
            self.constants[id(node)] = value
            if isinstance(value, int):
                return T.integer_literal_type(value)
            return t
        if not t.is_numeric_family:
            raise self.error(f"operator does not exist: - {t}", node)
        return t

    def _a_DPipe(self, node: exp.DPipe) -> PgType:
        lt, rt = self.analyze(node.left), self.analyze(node.right)
        if lt.element is not None or rt.element is not None:
            return self._array_concatenation(node, lt, rt)
        for child, t in ((node.left, lt), (node.right, rt)):
            if not (t.is_text_family or t.is_unknown):
                # anynonarray || text is textanycat, STABLE because of the output function
                self.walker_violation(MUTABLE, node)
            self.coerce(child, t, T.TEXT)
        self.collations[id(node)] = self.collations.get(id(node.left)) or self.collations.get(id(node.right))
        return T.TEXT

    def _array_concatenation(self, node: exp.DPipe, lt: PgType, rt: PgType) -> PgType:
        """``a || b`` with an array on either side: array_cat (array || array), array_append (array || element),
        array_prepend (element || array), all IMMUTABLE (pg_proc.dat), over anycompatible arguments; an untyped
        literal is read as the other side's array type (array_cat wins operator resolution: ``ia || '{1}'``;
        ``ia || '1'`` is array_in's ``malformed array literal``). Typed here so that a filter PostgreSQL accepts is
        accepted; not evaluated by Spark: PostgreSQL raises for arrays of unequal dimensions, which Spark's reading
        of an array column (flattened) cannot tell."""
        array = lt if lt.element is not None else rt
        assert array.element is not None
        common = array.element
        for side, t in ((node.left, lt), (node.right, rt)):
            if t.is_unknown and isinstance(side, exp.Literal) and side.is_string:
                self._array_literal(side, array.element)
            elif not t.is_unknown and (t.element or t).name != common.name:
                common = T.numeric_common(t.element or t, common)  # type: ignore[assignment]
                if common is None:
                    raise self.error(f"operator does not exist: {lt} || {rt}", node,
                                     hint="No operator matches the given name and argument types. "
                                     "You might need to add explicit type casts.")
        if any(t.element is not None and t.element.name != common.name for t in (lt, rt)):
            self.walker_violation(ONLY_SIMPLE, node)  # the array converted to common[]: an ArrayCoerceExpr
        raise self.untranslatable("|| on arrays (array_cat, array_append, array_prepend)", node,
                                  "compare with the array and the element separately, e.g. "
                                  "(x = ANY (ia) OR x = 1) for x = ANY (ia || 1)")

    def _a_Like(self, node: exp.Like) -> PgType:
        return self._pattern(node, "LIKE")

    def _a_ILike(self, node: exp.ILike) -> PgType:
        return self._pattern(node, "ILIKE")

    def _a_SimilarTo(self, node: exp.SimilarTo) -> PgType:
        return self._pattern(node, "SIMILAR TO")

    def _a_Escape(self, node: exp.Escape) -> PgType:
        self.analyze(node.this)
        t = self.analyze(node.expression)
        self.coerce(node.expression, t, T.TEXT)
        if isinstance(node.this, exp.SimilarTo):
            self.check_regex(node)
        return T.BOOL

    def _pattern(self, node: exp.Binary, op: str) -> PgType:
        quantified = quantified_array(node.right)
        if quantified is not None:  # LIKE / ILIKE ANY|ALL (…): subquery_Op in gram.y (SIMILAR TO has none)
            return self.quantified_pattern(node, op, *quantified)
        lt, rt = self.analyze(node.left), self.analyze(node.right)
        for child, t in ((node.left, lt), (node.right, rt)):
            if not (t.is_text_family or t.is_unknown):
                raise self.error(f"operator does not exist: {lt} ~~ {rt}", node)
            if child is node.left and t.name == "bpchar":
                continue  # bpcharlike(character, text) matches the padded value, trailing spaces included
            self.coerce(child, t, T.TEXT)
        if op == "ILIKE":
            self._require_binary_collation(node, "ILIKE", node.left, node.right)
        if op == "SIMILAR TO" and not isinstance(node.parent, exp.Escape):
            self.check_regex(node)  # with ESCAPE, _a_Escape checks it with its escape character
        return T.BOOL

    def _require_binary_collation(self, node: exp.Expr, what: str, *operands: exp.Expr,
                                  fix: str = 'case mapping depends on the collation; add COLLATE "C" (ASCII case '
                                  'mapping, which is exact in Spark) to the column in the filter') -> None:
        """Refuse ``what`` when an operand has a collation whose order or case mapping Spark does not share."""
        for o in operands:
            coll = self.collations.get(id(o))
            if coll is not None and coll not in T.BINARY_ORDER_COLLATIONS:
                raise self.untranslatable(f'{what} under collation "{coll}"', node, fix)

    def _a_Collate(self, node: exp.Collate) -> PgType:
        t = self.analyze(node.this)
        name = node.expression.name if isinstance(node.expression, (exp.Identifier, exp.Column, exp.Var)) \
            else node.expression.sql()
        funcs = self.context.functions
        if name in funcs.user_defined_collations:
            self.walker_violation(USER_COLLATION, node)
        elif funcs.builtin_collations and name not in funcs.builtin_collations:
            raise self.error(f'collation "{name}" for encoding "UTF8" does not exist', node)
        if not (t.is_text_family or t.is_unknown):
            raise self.error(f"collations are not supported by type {t}", node)
        self.collations[id(node)] = name
        if t.is_unknown:
            self.coerce(node.this, t, T.TEXT)
            return T.TEXT
        return t
