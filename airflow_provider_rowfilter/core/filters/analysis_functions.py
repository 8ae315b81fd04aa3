"""Row filters, semantics of function calls: which a filter may call and how each is typed.

A mixin of core/filters/analysis.py's analyzer: aggregates, window and set-returning functions raise
parse analysis's errors (parse_func.c); a user-defined or mutable function, and the SQL value
functions (``current_user`` …), are walker violations (publicationcmds.c); the built-ins Spark can
evaluate exactly are typed here (the string functions of issue 17 in core/filters/text.py); any other
built-in is refused as untranslatable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.functions import (
    AGGREGATES,
    SET_RETURNING,
    WINDOW_FUNCTIONS,
    function_name,
)
from airflow_provider_rowfilter.core.filters.grammar import MUTABLE, ONLY_SIMPLE, quantified_array
from airflow_provider_rowfilter.core.filters.pg_types import ANY, PgType

if TYPE_CHECKING:  # the analyzer this mixin is part of (core/filters/analysis.py ``_Analyzer``)
    _Analyzer = Any
else:
    _Analyzer = object

# Keywords PostgreSQL 18 still parses into SQLValueFunction nodes, which the walker does not allow.
SQL_VALUE_FUNCTIONS = frozenset({"current_user", "session_user", "user", "current_role", "current_catalog",
                                 "current_schema"})


class FunctionAnalysis(_Analyzer):
    """Handlers of core/filters/analysis.py's analyzer for function calls (a mixin: ``self`` is that analyzer)."""

    def _function(self, node: exp.Func) -> PgType:
        name = function_name(node)
        if not name:  # an operator sqlglot represents as a function (a @> b, j -> 'k' …)
            raise self.untranslatable(f"the operator in {node.sql(dialect='postgres')!r}", node,
                                      "rewrite the filter with the operators listed in docs/row-filters.md")
        if name == "row":
            return self._a_Tuple(node)
        if name in ("any", "some", "all") and quantified_array(node) is not None:
            return self._misplaced_quantifier(node)
        args = [a for a in node.iter_expressions()]
        if name in AGGREGATES:
            raise self.error("aggregate functions are not allowed in WHERE", node)
        if name in WINDOW_FUNCTIONS:
            raise self.error("window functions are not allowed in WHERE", node)
        if name in SET_RETURNING:
            raise self.error("set-returning functions are not allowed in WHERE", node)
        types = [self.analyze(a) for a in args]
        handler = getattr(self, f"_f_{name}", None)
        kind = self.context.functions.classify(name)
        if kind == "missing" and handler is None:
            signature = ", ".join(str(t) for t in types)
            raise self.error(f"function {name}({signature}) does not exist", node,
                             hint="No function matches the given name and argument types. "
                             "You might need to add explicit type casts.")
        if name in SQL_VALUE_FUNCTIONS and not args:
            self.walker_violation(ONLY_SIMPLE, node)
            return ANY
        if kind in ("user", "mutable"):
            self.walker_violation(MUTABLE, node)
            return ANY if handler is None else handler(node, args, types)
        if handler is None:
            raise self.untranslatable(f"function {name}()", node,
                                      "use the functions listed in docs/row-filters.md")
        return handler(node, args, types)

    def _expect(self, node, args, types, n: int, name: str) -> None:
        if len(args) != n:
            sig = ", ".join(str(t) for t in types)
            raise self.error(f"function {name}({sig}) does not exist", node)

    def _text_fn(self, node, args, types, name: str) -> PgType:
        self._expect(node, args, types, 1, name)
        if not (types[0].is_text_family or types[0].is_unknown):
            raise self.error(f"function {name}({types[0]}) does not exist", node)
        self.coerce(args[0], types[0], T.TEXT)
        self._inherit(node, args[0])
        if name in ("lower", "upper"):
            self._require_binary_collation(node, f"{name}()", args[0])
        return T.TEXT

    def _f_lower(self, node, args, types): return self._text_fn(node, args, types, "lower")
    def _f_upper(self, node, args, types): return self._text_fn(node, args, types, "upper")
    def _f_btrim(self, node, args, types): return self._text_fn(node, args, types, "btrim")
    def _f_ltrim(self, node, args, types): return self._text_fn(node, args, types, "ltrim")
    def _f_rtrim(self, node, args, types): return self._text_fn(node, args, types, "rtrim")

    def _f_length(self, node, args, types) -> PgType:
        self._expect(node, args, types, 1, "length")
        t = types[0]
        if not (t.is_text_family or t.is_unknown):
            raise self.error(f"function length({t}) does not exist", node)
        if t.is_unknown:
            self.coerce(args[0], t, T.TEXT)
        return T.INT4

    def _f_abs(self, node, args, types) -> PgType:
        self._expect(node, args, types, 1, "abs")
        if not types[0].is_numeric_family:
            raise self.error(f"function abs({types[0]}) does not exist", node)
        return types[0]

    def _f_mod(self, node, args, types) -> PgType:
        return self._arith(node, "%")

    def _f_starts_with(self, node, args, types) -> PgType:
        self._expect(node, args, types, 2, "starts_with")
        for a, t in zip(args, types, strict=True):
            if not (t.is_text_family or t.is_unknown):
                raise self.error(f"function starts_with({types[0]}, {types[1]}) does not exist", node)
            self.coerce(a, t, T.TEXT)
        return T.BOOL

    def _f_round(self, node, args, types) -> PgType:
        t = types[0]
        if len(args) == 1 and (t.name in ("float8", "float4") or t.is_integer):
            # round(integer) resolves to round(double precision): float8 is the preferred type of
            # the numeric category, so PostgreSQL prefers it over round(numeric).
            self.coerce(args[0], t, T.FLOAT8)
            return T.FLOAT8
        if t.is_integer or t.is_unknown:
            t = PgType("numeric", {"int2": 5, "int4": 10, "int8": 19}.get(t.name, 10), 0)
            self.coerce(args[0], types[0], t)
        if t.name != "numeric":
            raise self.error(f"function round({', '.join(map(str, types))}) does not exist", node)
        if len(args) == 2:
            digits = self.constants.get(id(args[1]))
            if not isinstance(digits, int):
                raise self.untranslatable("round() with a non-constant number of digits", node,
                                          "use a constant, e.g. round(amount, 2)")
            if t.precision is None:
                raise self.untranslatable("numeric without a precision", node, "declare numeric(p,s)")
            return PgType("numeric", min(t.precision + 1, T.SPARK_MAX_DECIMAL_PRECISION), max(digits, 0))
        if t.precision is None:
            raise self.untranslatable("numeric without a precision", node, "declare numeric(p,s)")
        return PgType("numeric", min(t.precision - (t.scale or 0) + 1, T.SPARK_MAX_DECIMAL_PRECISION), 0)

    def _f_replace(self, node, args, types) -> PgType:
        self._expect(node, args, types, 3, "replace")
        for a, t in zip(args, types, strict=True):
            if not (t.is_text_family or t.is_unknown):
                raise self.error(f"function replace({', '.join(map(str, types))}) does not exist", node)
            self.coerce(a, t, T.TEXT)
        self._inherit(node, args[0])
        return T.TEXT

    def _a_Any(self, node: exp.Any) -> PgType:
        return self._misplaced_quantifier(node)

    def _misplaced_quantifier(self, node: exp.Expr) -> PgType:
        """ANY/ALL (…) right of an operator that is no comparison: make_scalar_array_op (parse_oper.c) refuses an
        operator whose result is not boolean (``i4 + ANY (ia)``, ``t || ALL (ta)``)."""
        if isinstance(node.parent, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.DPipe)):
            raise self.error("op ANY/ALL (array) requires operator to yield boolean", node.parent)
        raise self.untranslatable("ANY (…) outside a comparison with ARRAY[…]", node,
                                  "compare with = ANY (ARRAY[…]) or write the values as IN (…)")
