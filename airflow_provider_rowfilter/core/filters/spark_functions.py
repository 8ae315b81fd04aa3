"""Row filters in Spark: the built-in functions a filter may call, with PostgreSQL's edge cases.

A mixin of core/filters/spark_translation.py's translator (``self.value`` renders an argument in the type
PostgreSQL computes it in): lower/upper under the C collation, the trims, length, abs, mod, round,
starts_with, replace and the string functions of varlena.c (substr/substring, left, right,
strpos/position, split_part, repeat) with PostgreSQL's rules for zero, negative, ``INT_MIN`` and NULL
arguments. The analysis (core/filters/analysis_functions.py, text.py) decided which calls get here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.spark_sql import LOWER, UPPER, ascii_lower, cast, fn, operand, raise_error

if TYPE_CHECKING:  # the translator this mixin is part of (core/filters/spark_translation.py ``_Translator``)
    _Translator = Any
else:
    _Translator = object


class FunctionTranslation(_Translator):
    """Renderers of core/filters/spark_translation.py's translator for function calls (a mixin: ``self`` is that
    translator)."""

    def _arg(self, node: exp.Expr, i: int) -> exp.Expr:
        return self.value(list(node.iter_expressions())[i])

    def _f_lower(self, node, t): return ascii_lower(self._arg(node, 0))

    def _f_upper(self, node, t):
        return fn("translate", self._arg(node, 0), exp.Literal.string(LOWER), exp.Literal.string(UPPER))

    def _f_btrim(self, node, t): return fn("trim", self._arg(node, 0))
    def _f_ltrim(self, node, t): return fn("ltrim", self._arg(node, 0))
    def _f_rtrim(self, node, t): return fn("rtrim", self._arg(node, 0))

    def _f_length(self, node, t):
        arg = list(node.iter_expressions())[0]
        value = self.value(arg)
        if self.rf.types[id(arg)].name == "bpchar":  # length(character) ignores trailing spaces
            value = fn("rtrim", value)
        return fn("char_length", value)

    def _f_abs(self, node, t):
        if t.name == "numeric":
            return self.numeric_abs(self._arg(node, 0), t)
        return cast(fn("abs", self._arg(node, 0)), t)

    def _f_mod(self, node, t):
        if t.name == "numeric":
            args = list(node.iter_expressions())
            types = [self.rf.targets.get(id(a), self.rf.types[id(a)]) for a in args]
            return self.numeric_arith(exp.Mod, self.value(args[0]), types[0], self.value(args[1]), types[1], t)
        return cast(exp.Mod(this=exp.Paren(this=self._arg(node, 0)), expression=exp.Paren(this=self._arg(node, 1))), t)

    # substr/substring, left, right, strpos/position, split_part, repeat (varlena.c), with PostgreSQL's
    # rules for zero, negative and NULL arguments; Spark's string functions count characters, as
    # PostgreSQL's do.
    def _strict(self, node, t, result: exp.Expr) -> exp.Expr:
        """NULL when any argument is NULL (the functions are strict): Spark's greatest() skips NULLs."""
        nulls = [exp.Is(this=operand(self.value(a)), expression=exp.Null()) for a in node.iter_expressions()]
        return exp.Case(ifs=[exp.If(this=exp.or_(*nulls), true=cast(exp.Null(), t))], default=result)

    def _f_substring(self, node, t):
        args = list(node.iter_expressions())
        s, start = self.value(args[0]), self.value(args[1])
        first = exp.Greatest(this=start, expressions=[exp.Literal.number(1)])
        if len(args) == 2:  # text_substr_no_len: from max(start, 1) to the end (greatest() skips a NULL)
            return self._strict(node, t, fn("substring", s, first))
        length = self.value(args[2])
        # text_substring: characters [max(S, 1), S + L), nothing when S + L <= 1, computed without overflow
        end = exp.Add(this=cast(start.copy(), PgType("int8")), expression=operand(length))
        count = exp.Least(this=exp.Greatest(this=exp.Sub(this=end, expression=first.copy()),
                                            expressions=[exp.Literal.number(0)]),
                          expressions=[exp.Literal.number(2147483647)])
        negative = exp.LT(this=operand(length.copy()), expression=exp.Literal.number(0))
        result = exp.Case(ifs=[exp.If(this=negative, true=raise_error("negative substring length not allowed"))],
                          default=fn("substring", s, first.copy(), cast(count, T.INT4)))
        return self._strict(node, t, result)

    def _f_left(self, node, t):
        s, n = self._arg(node, 0), self._arg(node, 1)
        # text_left: the first n characters; n < 0: all but the last |n|
        count = exp.Case(ifs=[exp.If(this=exp.GTE(this=operand(n), expression=exp.Literal.number(0)), true=n.copy())],
                         default=exp.Greatest(this=exp.Add(this=fn("char_length", s), expression=operand(n.copy())),
                                              expressions=[exp.Literal.number(0)]))
        return self._strict(node, t, fn("substring", s.copy(), exp.Literal.number(1), count))

    def _f_right(self, node, t):
        s, n = self._arg(node, 0), self._arg(node, 1)
        # text_right: the last n characters; n < 0: all but the first |n|. For n = INT_MIN, -n
        # overflows back to INT_MIN and pg_mbcharcliplen keeps the whole string (as PostgreSQL 15 to 18 do).
        length = fn("char_length", s)
        skipped = exp.Case(
            ifs=[exp.If(this=exp.EQ(this=operand(n), expression=exp.Literal.number(-2147483648)),
                        true=exp.Literal.number(0)),
                 exp.If(this=exp.GTE(this=operand(n.copy()), expression=exp.Literal.number(0)),
                        true=exp.Greatest(this=exp.Sub(this=length, expression=operand(n.copy())),
                                          expressions=[exp.Literal.number(0)]))],
            default=exp.Least(this=exp.Neg(this=exp.Paren(this=n.copy())), expressions=[length.copy()]))
        start = exp.Add(this=exp.Paren(this=skipped), expression=exp.Literal.number(1))
        return self._strict(node, t, fn("substring", s.copy(), start))

    def _f_position(self, node, t):
        # strpos(s, sub) / position(sub IN s): 1-based, 0 when absent, 1 for an empty sub (text_position)
        return fn("instr", self._arg(node, 0), self._arg(node, 1))

    def _f_split_part(self, node, t):
        n = self._arg(node, 2)
        zero = exp.EQ(this=operand(n), expression=exp.Literal.number(0))
        # Spark's split_part negates the index and fails for INT_MIN; PostgreSQL finds no such field: ''
        int_min = exp.EQ(this=operand(n.copy()), expression=exp.Literal.number(-2147483648))
        result = exp.Case(ifs=[exp.If(this=zero, true=raise_error("field position must not be zero")),
                               exp.If(this=int_min, true=exp.Literal.string(""))],
                          default=fn("split_part", self._arg(node, 0), self._arg(node, 1), n.copy()))
        return self._strict(node, t, result)

    def _f_repeat(self, node, t):
        s, n = self._arg(node, 0), self._arg(node, 1)
        # repeat: a negative count is 0; a result over MaxAllocSize (with its 4-byte header) is an error
        size = exp.Add(this=exp.Mul(this=cast(fn("octet_length", s), PgType("int8")),
                                    expression=exp.Greatest(this=n, expressions=[exp.Literal.number(0)])),
                       expression=exp.Literal.number(4))
        too_large = exp.GT(this=size, expression=exp.Literal.number(1073741823))
        result = exp.Case(ifs=[exp.If(this=too_large, true=raise_error("requested length too large"))],
                          default=fn("repeat", s.copy(), n.copy()))
        return self._strict(node, t, result)

    def _f_starts_with(self, node, t): return fn("startswith", self._arg(node, 0), self._arg(node, 1))
    def _f_replace(self, node, t): return fn("replace", self._arg(node, 0), self._arg(node, 1), self._arg(node, 2))

    def _f_round(self, node, t):
        args = list(node.iter_expressions())
        if t.name == "float8":
            return fn("bround", self.value(args[0]), exp.Literal.number(0))
        digits = self.value(args[1]) if len(args) > 1 else exp.Literal.number(0)
        return self.numeric_round(self.value(args[0]), digits, t)

