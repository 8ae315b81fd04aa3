"""Row filters, semantics of the comparisons: ``= <> < <= > >=``, ``IS [NOT] DISTINCT FROM``, BETWEEN, IN.

A mixin of core/filters/analysis.py's analyzer (same attributes: ``types``, ``targets``, ``constants``,
``collations``, ``context``): it resolves a comparison's operator as PostgreSQL's operator lookup does
(parse_oper.c; an unknown literal takes the other side's type, varchar compares as text), splits ``IN (…)``
as transformAExprIn does (parse_expr.c), hands ``op ANY/ALL (…)`` and row comparisons to text.py, and refuses
what Spark cannot compare exactly (text ordering outside a code-point collation, types without a Spark
counterpart).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.grammar import MUTABLE, ONLY_SIMPLE
from airflow_provider_rowfilter.core.filters.pg_types import ANY, PgType
from airflow_provider_rowfilter.core.filters.text import quantified_array, row_fields

if TYPE_CHECKING:  # the analyzer this mixin is part of (core/filters/analysis.py ``_Analyzer``)
    _Analyzer = Any
else:
    _Analyzer = object


class ComparisonAnalysis(_Analyzer):
    """Handlers of core/filters/analysis.py's analyzer for the comparisons (a mixin: ``self`` is that analyzer)."""

    def _operands(self, node: exp.Expr, left: exp.Expr, right: exp.Expr, op: str) -> PgType:
        """Resolve a binary operator's input type the way PostgreSQL's operator lookup would."""
        lt, rt = self.analyze(left), self.analyze(right)
        common = self.common_type(lt, rt, op, node)
        self.coerce(left, lt, common)
        self.coerce(right, rt, common)
        return common

    def common_type(self, lt: PgType, rt: PgType, op: str, node: exp.Expr) -> PgType:
        if ANY in (lt, rt):  # already rejected by the walker; PostgreSQL resolves these operators
            return ANY
        if lt.is_unknown and rt.is_unknown:
            return T.TEXT
        if lt.is_unknown:
            return self._unknown_to(rt)
        if rt.is_unknown:
            return self._unknown_to(lt)
        if lt == rt:
            return lt
        numeric = T.numeric_common(lt, rt)
        if numeric is not None:
            if numeric.name == "numeric":
                return self._numeric_result(lt, rt)
            return numeric
        if lt.is_text_family and rt.is_text_family:
            # Operator resolution: text wins as the preferred type when either side is text;
            # otherwise character's own operators (bpchareq …) match one side exactly, so
            # varchar = character compares as character (v::bpchar = c).
            if "text" not in (lt.name, rt.name) and "bpchar" in (lt.name, rt.name):
                return PgType("bpchar")
            return T.TEXT
        if {lt.name, rt.name} == {"date", "timestamp"}:
            return T.TIMESTAMP
        if {lt.name, rt.name} in ({"date", "timestamptz"}, {"timestamp", "timestamptz"}):
            self.walker_violation(MUTABLE, node)
            return T.TIMESTAMPTZ
        if lt.name == rt.name:
            return PgType(lt.name)
        raise self.error(f"operator does not exist: {lt} {op} {rt}", node,
                         hint="No operator matches the given name and argument types. "
                         "You might need to add explicit type casts.")

    @staticmethod
    def _unknown_to(t: PgType) -> PgType:
        return PgType("bpchar") if t.name == "bpchar" else (T.TEXT if t.name == "varchar" else t)

    @staticmethod
    def _numeric_result(lt: PgType, rt: PgType) -> PgType:
        """numeric with the smallest precision/scale that holds both sides exactly (for Spark)."""
        return T.numeric_holding(lt, rt)

    def _comparison(self, node: exp.Binary, op: str) -> PgType:
        quantified = quantified_array(node.expression)
        if quantified is not None and row_fields(node.left) is not None:
            return self.row_quantified(node, op, *quantified)  # record_eq on each element (text.py)
        if quantified is not None:
            return self.quantified(node, op, *quantified)
        left, right = row_fields(node.left), row_fields(node.right)
        if left is not None or right is not None:
            return self.row_comparison(node, op, left, right)
        common = self._operands(node, node.left, node.right, op)
        self._check_comparable(common, node, op, node.left, node.right)
        return T.BOOL

    def _check_comparable(self, common: PgType, node: exp.Expr, op: str, *operands: exp.Expr) -> None:
        if common.element is not None:
            # array_eq and array_cmp (arrayfuncs.c) compare the dimensions and lower bounds as well as the elements
            # ('{{1,2}}' = '{1,2}' and '[0:1]={1,2}' = '{1,2}' are false); the apply reads an array column flattened,
            # its bounds dropped, so Spark's comparison of the two arrays cannot tell them apart
            raise self.untranslatable("comparing arrays (=, <>, <, IN, IS DISTINCT FROM, NULLIF, GREATEST …)", node,
                                      "compare elements (x = ANY (a), a @> b), or filter at the source")
        if common.name == "bool" and op not in ("=", "<>"):
            return
        if common.is_text_family and op not in ("=", "<>"):
            self._require_binary_collation(node, "ordering text", *operands, fix=(
                'compare with COLLATE "C" (code-point order, which Spark uses), e.g. (name COLLATE "C" < \'m\')'))
        self._require_spark_type(common, node)

    def _require_spark_type(self, t: PgType, node: exp.Expr) -> None:
        if t.name in ("unknown", "bool", "any") or t.is_text_family:
            return
        if t.name == "numeric" and (t.precision is None or t.precision > T.SPARK_MAX_DECIMAL_PRECISION):
            raise self.untranslatable(
                f"numeric without a precision of at most {T.SPARK_MAX_DECIMAL_PRECISION} digits", node,
                "declare the column numeric(p,s) with p <= 38 on the publisher, or cast the expression in the "
                "filter (e.g. (a * b)::numeric(20,2) > 100)")
        if T.spark_type(t) is None:
            raise self.untranslatable(f"type {t}", node,
                                      "filter on columns of the types listed in docs/row-filters.md")

    def _a_EQ(self, node):  return self._comparison(node, "=")
    def _a_NEQ(self, node): return self._comparison(node, "<>")
    def _a_GT(self, node):  return self._comparison(node, ">")
    def _a_GTE(self, node): return self._comparison(node, ">=")
    def _a_LT(self, node):  return self._comparison(node, "<")
    def _a_LTE(self, node): return self._comparison(node, "<=")
    def _a_NullSafeEQ(self, node):  return self._comparison(node, "=")
    def _a_NullSafeNEQ(self, node): return self._comparison(node, "=")

    def _a_Between(self, node: exp.Between) -> PgType:
        # x >= low AND x <= high: each comparison resolves its own operator (c BETWEEN v AND t
        # compares c >= v::bpchar and c::text <= t); the translation converts x per bound
        xt = self.analyze(node.this)
        for bound in (node.args["low"], node.args["high"]):
            bt = self.analyze(bound)
            pair = self.common_type(xt, bt, ">=", node)
            self.coerce(bound, bt, pair)
            self._check_comparable(pair, node, "<", node.this, bound)
            if xt.is_unknown:
                self.coerce(node.this, xt, pair)
        return T.BOOL

    def _a_In(self, node: exp.In) -> PgType:
        if node.args.get("query") or any(isinstance(e, (exp.Select, exp.Subquery)) for e in node.expressions):
            self.analyze(node.this)
            self.walker_violation(ONLY_SIMPLE, node.args.get("query") or node.expressions[0])
            return T.BOOL
        lt = self.analyze(node.this)
        types = {id(e): self.analyze(e) for e in node.expressions}
        array, pairwise = in_list_groups(node)
        common = T.TEXT
        if array:
            # x = ANY (ARRAY[…]) over the column-free items, in the common type of x and those items
            common = lt
            for e in array:
                common = self.common_type(common, types[id(e)], "=", node)
            for e in array:
                self.coerce(e, types[id(e)], common)
            self._check_comparable(common, node, "=", node.this, *array)
            known = [t for t in (lt, *(types[id(e)] for e in array)) if not t.is_unknown]
            if known and all(t.name == "varchar" for t in known):
                # varchar has no "=" of its own: PostgreSQL compares as text and wraps the
                # varchar[] array in an ArrayCoerceExpr, which the row-filter walker rejects
                # (so v IN ('a', 'b') is refused, while v = 'a' OR v = 'b' is fine)
                self.walker_violation(ONLY_SIMPLE, node)
        for e in pairwise:
            # x = item, each resolved as its own operator: the translation converts x per item
            pair = self.common_type(lt, types[id(e)], "=", node)
            self.coerce(e, types[id(e)], pair)
            self._check_comparable(pair, node, "=", node.this, e)
        if lt.is_unknown:
            self.coerce(node.this, lt, common)
        return T.BOOL


def in_list_groups(node: exp.In) -> tuple[list[exp.Expr], list[exp.Expr]]:
    """Split ``x IN (…)`` the way PostgreSQL's transformAExprIn does.

    With more than one item that references no column, those items become one
    ``x = ANY (ARRAY[…])`` in their common type with ``x``; every other item (all of them when
    at most one is column-free) is compared as ``x = item`` with its own operator, ORed in list
    order after the array. So ``i8 IN (f8, 9223372036854775806)`` compares i8 exactly with the
    literal, not as double precision.
    """
    items = list(node.expressions)
    free = [e for e in items if not any(isinstance(n, exp.Column) for n in e.walk())]
    if len(free) > 1:
        chosen = {id(e) for e in free}  # by identity, once: a list of 100,000 items compared each with each took minutes
        return free, [e for e in items if id(e) not in chosen]
    return [], items
