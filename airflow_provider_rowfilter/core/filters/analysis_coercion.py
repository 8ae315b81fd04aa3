"""Row filters, semantics of common types and casts: CASE, COALESCE, NULLIF, GREATEST, LEAST and ``::``.

A mixin of core/filters/analysis.py's analyzer: it resolves the common type of a construct's parts as
``select_common_type`` (parse_coerce.c) does, and types a cast as ``coerce_type`` does: a cast of a
string literal folded into a constant by the type's input function (core/filters/constants.py), a
binary-coercible, function or I/O cast otherwise, with the walker's verdict on each (an I/O cast is not
a simple node; a cast whose function is STABLE, such as timestamp → timestamptz, is mutable).
"""

from __future__ import annotations

import decimal
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_provider_rowfilter.core.errors import InvalidRowFilterError
from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.constants import (
    InvalidConstant,
    NumericFieldOverflow,
    UnrepresentableConstant,
    constant_value,
    decimal_type,
    numeric_typmod,
)
from airflow_provider_rowfilter.core.filters.grammar import MUTABLE, ONLY_SIMPLE, node_position
from airflow_provider_rowfilter.core.filters.pg_types import PgType

if TYPE_CHECKING:  # the analyzer this mixin is part of (core/filters/analysis.py ``_Analyzer``)
    _Analyzer = Any
else:
    _Analyzer = object

_BINARY_CAST = {("text", "varchar"), ("varchar", "text"), ("varchar", "varchar"), ("text", "text")}
_IMMUTABLE_FUNCTION_CASTS = {
    ("bpchar", "text"), ("bpchar", "varchar"), ("date", "timestamp"), ("timestamp", "date"),
    ("int4", "bool"), ("bool", "int4"), ("float4", "float8"), ("float8", "float4"),
}
_STABLE_CASTS = {
    ("date", "timestamptz"), ("timestamp", "timestamptz"), ("timestamptz", "timestamp"),
    ("timestamptz", "date"),
}


#: Type families whose = operators take any two members as they are (pg_operator: int24eq, int48eq, float48eq,
#: date_eq_timestamp, timestamp_eq_timestamptz …).
_CROSS_TYPE_EQUALITY = ({"int2", "int4", "int8"}, {"float4", "float8"}, {"date", "timestamp", "timestamptz"})



class CoercionAnalysis(_Analyzer):
    """Handlers of core/filters/analysis.py's analyzer for conditional expressions and casts (a mixin:
    ``self`` is that analyzer)."""

    # --- conditional expressions ------------------------------------------------------------------
    def _common_of(self, node: exp.Expr, parts: list[exp.Expr], construct: str) -> PgType:
        types = [self.analyze(p) for p in parts]
        common = T.UNKNOWN
        for t in types:
            if common.is_unknown:
                common = t
            elif not t.is_unknown and t != common:
                # select_common_type: switch to a later type only when the earlier one converts to
                # it implicitly and not back. Numbers climb int2 < int4 < int8 < numeric < float4
                # < float8 (COALESCE(real, numeric) is real); the string types all convert both
                # ways, so the first one stays (COALESCE(c, t) is character).
                resolved = T.numeric_common(common, t)
                if resolved is not None:
                    order = ("int2", "int4", "int8", "numeric", "float4", "float8")
                    top = max(common, t, key=lambda x: order.index(x.name))
                    common = self._numeric_result(common, t) if top.name == "numeric" else PgType(top.name)
                elif common.is_text_family and t.is_text_family:
                    common = PgType(common.name) if common.name != t.name or common.precision != t.precision \
                        else common
                elif {common.name, t.name} == {"date", "timestamp"}:
                    common = T.TIMESTAMP
                else:
                    raise self.error(f"{construct} types {common} and {t} cannot be matched", node)
        if common.is_unknown:
            common = T.TEXT
        for p, t in zip(parts, types, strict=True):
            self.coerce(p, t, common)
        colls = [self.collations.get(id(p)) for p in parts if self.collations.get(id(p))]
        self.collations[id(node)] = colls[0] if colls else None
        return common

    def _a_Coalesce(self, node: exp.Coalesce) -> PgType:
        return self._common_of(node, [node.this, *node.expressions], "COALESCE")

    def _a_Greatest(self, node: exp.Greatest) -> PgType:
        parts = [node.this, *node.expressions]
        common = self._common_of(node, parts, "GREATEST")
        self._check_comparable(common, node, "<", *parts)
        return common

    def _a_Least(self, node: exp.Least) -> PgType:
        parts = [node.this, *node.expressions]
        common = self._common_of(node, parts, "LEAST")
        self._check_comparable(common, node, "<", *parts)
        return common

    def _a_Nullif(self, node: exp.Nullif) -> PgType:
        lt = self.analyze(node.this)
        rt = self.analyze(node.expression)
        common = self.common_type(lt, rt, "=", node)
        if common.element is not None:
            self._check_comparable(common, node, "=", node.this, node.expression)
        self.coerce(node.this, lt, common)
        self.coerce(node.expression, rt, common)
        self._inherit(node, node.this)
        # NULLIF returns the first argument of its = operator (transformNullIf, parse_expr.c): a cross-type
        # operator of the same family (int24eq, float48eq, date_eq_timestamp …) takes it unconverted, so
        # NULLIF(i2, i4) is a smallint (and i2 * i2 of it overflows as smallint); otherwise the converted value.
        if any(lt.name in family and rt.name in family for family in _CROSS_TYPE_EQUALITY):
            return lt
        return common

    def _a_Case(self, node: exp.Case) -> PgType:
        subject = node.this
        if subject is not None:
            st = self.analyze(subject)
            for branch in node.args["ifs"]:
                wt = self.analyze(branch.this)
                common = self.common_type(st, wt, "=", branch)
                self.coerce(branch.this, wt, common)
                self.targets.setdefault(id(subject), common)
                self._check_comparable(common, branch, "=", subject, branch.this)
        else:
            for branch in node.args["ifs"]:
                t = self.analyze(branch.this)
                if t.name != "bool" and not t.is_unknown:
                    raise self.error(f"argument of CASE/WHEN must be type boolean, not type {t}", branch.this)
                self.coerce(branch.this, t, T.BOOL)
        results = [b.args["true"] for b in node.args["ifs"]]
        if node.args.get("default") is not None:
            results.insert(0, node.args["default"])  # transformCaseExpr puts ELSE first
        return self._common_of(node, results, "CASE")

    # --- casts ------------------------------------------------------------------------------------
    def _a_Cast(self, node: exp.Cast) -> PgType:
        target = T.parse_type(node.to.sql(dialect="postgres"))
        if target.name in ("int", "integer"):
            target = T.INT4
        source = self.analyze(node.this)
        if id(node.this) in self.constants and source.is_unknown:
            # PostgreSQL folds a cast of a string literal (or NULL) into a typed constant at parse
            # time with the type's input function. A cast of a typed constant (32768::int2,
            # 2.5::integer) is a cast function PostgreSQL runs when the filter is evaluated.
            if target.name == "numeric" and target.precision is not None:
                typmod = self._numeric_literal_cast(node, target)
                if typmod is not None:
                    return typmod
            value = self.literal_value(node.this, self.constants[id(node.this)], target)
            self.constants[id(node)] = value
            if target.name == "numeric" and target.precision is None and isinstance(value, (int, decimal.Decimal)):
                target = decimal_type(decimal.Decimal(value))  # a constant's own digits suffice
            elif target.element is not None and target.element.name == "numeric" and target.element.precision is None \
                    and isinstance(value, list):  # '{1.5,NaN}'::numeric[] (how pg_get_expr prints an array literal)
                element = PgType("numeric", 1, 0)
                for v in value:
                    if isinstance(v, decimal.Decimal):
                        element = T.numeric_holding(element, decimal_type(v))
                target = PgType("_array", element=element)
            self._require_spark_type(target, node)
            return target
        if source == target or (source.name, target.name) in _BINARY_CAST:
            return target
        if source.is_text_family and target.is_text_family:
            return target  # binary-coercible or rtrim(), plus the immutable length coercion
        pair = (source.name, target.name)
        if pair in _STABLE_CASTS:
            self.walker_violation(MUTABLE, node)
        elif source.is_numeric_family and target.is_numeric_family:
            if source.name in ("float4", "float8") and target.name == "numeric":
                raise self.untranslatable(
                    "a cast from double precision to numeric", node,
                    "PostgreSQL keeps 15 significant digits there and Spark keeps all; compare as double precision")
            if target.name == "numeric" and target.precision is None and (source.is_integer or source.name == "numeric"):
                # integer -> numeric (what pg_get_expr shows as (50)::numeric) keeps the value exactly
                target = source if source.name == "numeric" else PgType(
                    "numeric", {"int2": 5, "int4": 10, "int8": 19}[source.name], 0)
            self._require_spark_type(target, node)
        elif pair in _IMMUTABLE_FUNCTION_CASTS:
            pass
        elif target.is_text_family or source.is_text_family or source.name in ("json", "jsonb", "uuid"):
            self.walker_violation(ONLY_SIMPLE, node)  # CoerceViaIO
        else:
            raise self.error(f"cannot cast type {source} to {target}", node)
        return target

    def _numeric_literal_cast(self, node: exp.Cast, target: PgType) -> PgType | None:
        """``'…'::numeric(p,s)``: numeric_in reads the literal without the typmod and the typmod is a cast function
        (numeric(numeric, int4)) PostgreSQL runs with the filter, so a value the typmod refuses (``'123.45'::numeric(3,1)``,
        ``'Infinity'::numeric(5,2)``: apply_typmod's ``numeric field overflow``) is accepted here and raises when the
        planner folds it (core/filters/folding.py), for every row. Such a literal is typed as a numeric constant of its
        own digits, cast; None when the typmod takes the value (the cast is then folded into the constant here)."""
        literal = node.this
        value = self.literal_value(literal, self.constants[id(literal)], T.NUMERIC)
        if value is None:
            return None
        assert isinstance(value, decimal.Decimal) and target.precision is not None
        try:
            numeric_typmod(value, target.precision, target.scale or 0)
        except NumericFieldOverflow:
            self.constants[id(literal)] = value
            self.types[id(literal)] = decimal_type(value)
            self._require_spark_type(self.types[id(literal)], node)
            self._require_spark_type(target, node)
            return target
        return None

    def literal_value(self, node: exp.Expr, value: object, target: PgType) -> object:
        """Convert a constant to ``target`` as PostgreSQL's input function would, or raise its error."""
        try:
            return constant_value(value, target, self.context.timezone)
        except InvalidConstant as e:
            raise self.error(str(e), node) from None
        except NumericFieldOverflow as e:
            raise InvalidRowFilterError(str(e), detail=e.detail, source=self.sql, position=node_position(node)) from None
        except UnrepresentableConstant as e:
            raise self.untranslatable(e.what, node, e.fix) from None
