"""Row filters in Spark: numeric, NaN and the infinities included, with numeric.c's rules.

PostgreSQL's numeric holds ``NaN`` (storable in a ``numeric(p,s)`` column) and, from PostgreSQL 14, ``Infinity`` and
``-Infinity`` (not under a typmod with a precision: apply_typmod_special), which Spark's DECIMAL cannot. A numeric is
therefore a ``STRUCT<k: DOUBLE, v: DECIMAL(p,s)>`` in Spark (pg_types.py ``spark_type``; read from the text form by
spark_sql.py ``numeric_read``): ``k`` is 0 for a finite value, whose ``v`` is the value, and NaN, +Infinity or -Infinity
for a special value, whose ``v`` is NULL; an SQL NULL is a NULL struct. Spark orders a struct field by field, doubles
with NaN above every other value and equal to itself, and a NULL field equal to a NULL field, so Spark's own ``=``,
``<``, ``IN``, ``BETWEEN``, ``GREATEST``, ``NULLIF``, ``<=>``, ``CASE`` … on these structs are numeric_cmp's order
(numeric.c ``cmp_numerics``: -Infinity < every finite value < Infinity < NaN, NaN = NaN) with SQL's NULL rules; only
the struct types must be the same, which the analysis's common types make them.

What computes a numeric works on the two channels, ``k`` and ``v`` (:class:`Channels`), and packs them once into the
struct its consumer reads: ``k`` follows IEEE arithmetic on doubles, which for ``+`` and ``-`` is numeric's own rule
(NaN + x is NaN, Infinity - Infinity is NaN, Infinity + x is Infinity), and ``v`` the decimal arithmetic, NULL as soon
as an operand is special. ``*`` (Infinity * 0 is NaN, Infinity * x has the sign of x), ``%`` (Infinity % x is NaN,
x % Infinity is x, Infinity % 0 raises), abs, round, the casts to integer (``cannot convert NaN to integer``), to
double precision (NaN and the infinities as they are) and to ``numeric(p,s)`` (an infinity raises ``numeric field
overflow``) each have their case here, after numeric.c's ``numeric_mul_opt_error``, ``numeric_mod_opt_error``,
``numeric_abs``, ``numeric_round``, ``numeric_int4_opt_error``, ``numeric_float8`` and ``apply_typmod_special``.
A mixin of core/filters/spark_translation.py's translator.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_provider_rowfilter.core.errors import UntranslatableFilterError
from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.spark_sql import cast, double, fn, operand, raise_error

if TYPE_CHECKING:  # the translator this mixin is part of (core/filters/spark_translation.py ``_Translator``)
    _Translator = Any
else:
    _Translator = object

DOUBLE = exp.DataType.build("DOUBLE")


def decimal_of(e: exp.Expr, t: PgType) -> exp.Expr:
    """``e`` as the DECIMAL of numeric(p,s) ``t``: Spark rounds half away from zero, as apply_typmod does, and raises
    when the value needs more digits (ANSI mode)."""
    if T.spark_type(t) is None:
        raise UntranslatableFilterError(f"type {t}({t.precision},{t.scale}) has no exact Spark counterpart")
    return exp.Cast(this=e, to=exp.DataType.build(T.spark_decimal(t), dialect="spark"))


def _binary(cls, left: exp.Expr, right: exp.Expr) -> exp.Expr:
    """``left op right``, a compound operand parenthesised (``0 - (a - b)``)."""
    return cls(this=operand(left), expression=operand(right))


def _field(e: exp.Expr, name: str) -> exp.Expr:
    """A field of a numeric struct. Of a column's, ``n.k``: the apply reads that channel from the change's text
    (core/apply/plan.py ``filter_expression``, spark_sql.py ``numeric_channel_read``) rather than the whole struct."""
    return exp.Dot(this=e if isinstance(e, exp.Column) else exp.Paren(this=e), expression=exp.to_identifier(name))


@dataclass(frozen=True)
class Channels:
    """A numeric as two Spark values: ``k`` (DOUBLE: 0 for a finite value, else NaN or ±Infinity; NULL for NULL) and
    ``v`` (DECIMAL: the finite value; NULL for a special value or NULL)."""

    k: exp.Expr
    v: exp.Expr
    finite: bool = False  # never NaN nor an infinity (an integer, a finite constant): ``k`` is 0 or NULL
    constant: bool = False  # a constant that is not NULL


def pack(c: Channels, t: PgType) -> exp.Expr:
    """The struct of ``c``: NULL when ``k`` is."""
    struct = fn("named_struct", exp.Literal.string("k"), c.k, exp.Literal.string("v"), c.v)
    return exp.Case(ifs=[exp.If(this=exp.Is(this=c.k.copy(), expression=exp.Null()), true=cast(exp.Null(), t))],
                    default=struct)


def numeric_constant(d: decimal.Decimal, t: PgType) -> exp.Expr:
    """The struct of a constant (never NULL)."""
    if d.is_nan():
        k, v = double("NaN"), decimal_of(exp.Null(), t)
    elif d.is_infinite():
        k, v = double("-Infinity" if d.is_signed() else "Infinity"), decimal_of(exp.Null(), t)
    else:
        k, v = double("0"), decimal_of(exp.Literal.string(format(d.copy_abs() if d.is_zero() else d, "f")), t)
    return fn("named_struct", exp.Literal.string("k"), k, exp.Literal.string("v"), v)


def _is_infinite(k: exp.Expr) -> exp.Expr:
    return exp.EQ(this=fn("abs", k), expression=double("Infinity"))


def _is_nan(k: exp.Expr) -> exp.Expr:
    return fn("isnan", k)


class NumericTranslation(_Translator):
    """Renderers of core/filters/spark_translation.py's translator for numeric values (a mixin: ``self`` is that
    translator). A struct this mixin built remembers its channels, so that what computes on it reads them rather
    than the struct's fields (one copy of each operand per level, however deep the arithmetic nests)."""

    def _channel_table(self) -> dict[int, tuple[exp.Expr, Channels]]:
        """id(struct) -> (struct, its channels); the struct kept, so that no other node takes its id."""
        table = self.__dict__.get("_numeric_channels")
        if table is None:
            table = self.__dict__["_numeric_channels"] = {}
        return table

    def _remember(self, struct: exp.Expr, c: Channels) -> exp.Expr:
        self._channel_table()[id(struct)] = (struct, c)
        return struct

    def _known(self, e: exp.Expr) -> Channels | None:
        while isinstance(e, exp.Paren):
            e = e.this
        entry = self._channel_table().get(id(e))
        return entry[1] if entry is not None and entry[0] is e else None

    def numeric(self, c: Channels, t: PgType) -> exp.Expr:
        """``c`` packed into the struct of numeric ``t``, its channels remembered."""
        return self._remember(pack(c, t), c)

    def channels(self, e: exp.Expr) -> Channels:
        """The channels of a numeric struct expression: remembered, or its fields."""
        known = self._known(e)
        if known is not None:
            return Channels(known.k.copy(), known.v.copy(), known.finite, known.constant)
        return Channels(_field(e.copy(), "k"), _field(e.copy(), "v"))

    def numeric_constant(self, d: decimal.Decimal, t: PgType) -> exp.Expr:
        built = numeric_constant(d, t)
        return self._remember(built, Channels(built.expressions[1], built.expressions[3], d.is_finite(), True))

    # --- conversions ----------------------------------------------------------------------------------
    def integer_channels(self, e: exp.Expr, own: PgType) -> Channels:
        """An integer as a numeric: finite, NULL when it is NULL (``x * 0`` is 0 or NULL, and never overflows)."""
        if isinstance(e, exp.Literal):
            k: exp.Expr = double("0")
        else:
            k = exp.Cast(this=exp.Mul(this=exp.Paren(this=e.copy()), expression=exp.Literal.number(0)), to=DOUBLE.copy())
        return Channels(k, decimal_of(e, PgType("numeric", {"int2": 5, "int4": 10, "int8": 19}[own.name], 0)), True)

    def numeric_from_integer(self, e: exp.Expr, own: PgType, t: PgType) -> exp.Expr:
        c = self.integer_channels(e, own)
        return self.numeric(Channels(c.k, decimal_of(c.v, t), True), t)

    def operand_channels(self, e: exp.Expr, t: PgType) -> Channels:
        """The channels of an arithmetic operand of type ``t``: numeric, or an integer the operator takes as it is."""
        return self.integer_channels(e, t) if t.is_integer else self.channels(e)

    def numeric_widen(self, e: exp.Expr, t: PgType) -> exp.Expr:
        """A numeric as numeric(p,s) ``t``, as the analysis's common types widen it (never an error)."""
        if self._known(e) is None:
            return cast(e, t)  # the struct cast converts its v, NULL stays NULL
        c = self.channels(e)
        return self.numeric(Channels(c.k, decimal_of(c.v, t), c.finite), t)

    def numeric_typmod(self, e: exp.Expr, t: PgType) -> exp.Expr:
        """An explicit cast to numeric(p,s) (numeric.c apply_typmod, apply_typmod_special): NaN stays, an infinity raises
        ``numeric field overflow``, a finite value is rounded to the scale (Spark raises when it overflows)."""
        c = self.channels(e)
        k = exp.Case(ifs=[exp.If(this=_is_infinite(c.k), true=raise_error("numeric field overflow"))], default=c.k.copy())
        return self.numeric(Channels(k, decimal_of(c.v, t)), t)

    def numeric_to_integer(self, e: exp.Expr, target: PgType) -> exp.Expr:
        """numeric → smallint/integer/bigint (numeric.c numeric_int4_opt_error and kin): rounded half away from zero;
        NaN and the infinities raise ``cannot convert NaN to integer`` / ``cannot convert infinity to integer``."""
        c = self.channels(e)
        name = {"int2": "smallint", "int4": "integer", "int8": "bigint"}[target.name]
        message = exp.Case(ifs=[exp.If(this=_is_nan(c.k.copy()), true=exp.Literal.string(f"cannot convert NaN to {name}"))],
                           default=exp.Literal.string(f"cannot convert infinity to {name}"))
        special = exp.NEQ(this=c.k, expression=double("0"))
        value = cast(fn("round", c.v, exp.Literal.number(0)), target)
        return exp.Case(ifs=[exp.If(this=special, true=fn("raise_error", message))], default=value)

    def numeric_to_float(self, e: exp.Expr, target: PgType) -> exp.Expr:
        """numeric → double precision or real (numeric.c numeric_float8, numeric_float4): NaN and the infinities as they
        are."""
        c = self.channels(e)
        finite = exp.EQ(this=c.k, expression=double("0"))
        return exp.Case(ifs=[exp.If(this=finite, true=cast(c.v, target))], default=cast(c.k.copy(), target))

    # --- arithmetic -----------------------------------------------------------------------------------
    def numeric_arith(self, cls, left: exp.Expr, lt: PgType, right: exp.Expr, rt: PgType, t: PgType) -> exp.Expr:
        """``left op right`` (``+ - * %``) in numeric ``t``; an integer operand is taken as a numeric of its digits."""
        a, b = self.operand_channels(left, lt), self.operand_channels(right, rt)
        if cls in (exp.Add, exp.Sub):  # IEEE's NaN and infinity rules are numeric_add's and numeric_sub's
            k: exp.Expr = _binary(cls, a.k, b.k)
            v: exp.Expr = _binary(cls, a.v, b.v)
        elif cls is exp.Mul:
            k, v = self._product(a, b), _binary(exp.Mul, a.v, b.v)
        else:
            k, v = self._remainder(a, b)
        return self.numeric(Channels(k, decimal_of(v, t)), t)

    @staticmethod
    def _product(a: Channels, b: Channels) -> exp.Expr:
        """numeric_mul's special value: NaN with a NaN, NaN for an infinity times 0, else an infinity with the product
        of the signs; 0 for two finite values. Each operand stands for its sign when finite, for its k when not: times
        a finite value, that is k times the value's sign; times a special constant, the other's stand-in times its k;
        else the product of the stand-ins is one of -1, 0, 1 exactly when both are finite."""
        def signed(c: Channels) -> exp.Expr:
            return exp.Coalesce(this=fn("sign", c.v), expressions=[c.k])
        if a.finite or b.finite:
            other, plain = (b, a) if a.finite else (a, b)
            return _binary(exp.Mul, other.k, fn("sign", plain.v))
        if a.constant or b.constant:  # NaN or an infinity: its k times the other's sign (or k)
            other, special = (b, a) if a.constant else (a, b)
            return _binary(exp.Mul, signed(other), special.k)
        product = _binary(exp.Mul, signed(a), signed(b))
        both_finite = exp.LTE(this=fn("abs", product), expression=double("1"))
        return exp.Case(ifs=[exp.If(this=both_finite, true=double("0"))], default=product.copy())

    @staticmethod
    def _remainder(a: Channels, b: Channels) -> tuple[exp.Expr, exp.Expr]:
        """numeric_mod (numeric.c numeric_mod_opt_error): NaN with a NaN; an infinity modulo 0 raises ``division by
        zero``, modulo anything else is NaN; a finite value modulo an infinity is itself; Spark's decimal % for two
        finite values (which raises for a zero divisor). k: ``a.k * 0`` is NaN for a special dividend, ``sign(b.k) *
        0`` NaN for a NaN divisor, 0 for an infinite one."""
        zero = exp.Literal.number(0)
        k: exp.Expr = _binary(exp.Add, _binary(exp.Mul, a.k, zero.copy()), _binary(exp.Mul, fn("sign", b.k), zero.copy()))
        v: exp.Expr = exp.Mod(this=exp.Paren(this=a.v), expression=exp.Paren(this=b.v))
        if not a.finite:
            by_zero = exp.and_(_is_infinite(a.k.copy()), exp.EQ(this=b.v.copy(), expression=zero.copy()))
            k = exp.Case(ifs=[exp.If(this=by_zero, true=raise_error("division by zero"))], default=k)
        if not b.finite:
            v = exp.Case(ifs=[exp.If(this=_is_infinite(b.k.copy()), true=a.v.copy())], default=v)
        return k, v

    def numeric_neg(self, e: exp.Expr, t: PgType) -> exp.Expr:
        """``-x`` (numeric_uminus): -NaN is NaN; 0 - k keeps a finite value's k a positive 0."""
        c = self.channels(e)
        k = _binary(exp.Sub, double("0"), c.k)
        return self.numeric(Channels(k, decimal_of(exp.Neg(this=exp.Paren(this=c.v)), t)), t)

    def numeric_abs(self, e: exp.Expr, t: PgType) -> exp.Expr:
        """abs(x) (numeric_abs): abs(NaN) is NaN, abs(-Infinity) Infinity."""
        c = self.channels(e)
        return self.numeric(Channels(fn("abs", c.k), decimal_of(fn("abs", c.v), t)), t)

    def numeric_round(self, e: exp.Expr, digits: exp.Expr, t: PgType) -> exp.Expr:
        """round(x, n) (numeric_round): half away from zero, as Spark's round does; NaN and the infinities unchanged."""
        c = self.channels(e)
        return self.numeric(Channels(c.k, decimal_of(fn("round", c.v, digits), t)), t)
