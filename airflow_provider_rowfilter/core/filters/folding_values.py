"""Row filters, the planner's constant folding: PostgreSQL's operators and casts on constant values.

What core/filters/folding.py's walker computes once it holds the values of a node's arguments, with PostgreSQL's
semantics: integer range checks (int.c, int8.c), truncating division and C's ``%``, numeric with its typmod
(numeric.c ``apply_typmod``) and its NaN and infinities (their order, arithmetic and casts), double precision
overflow and underflow (float.c), casts between them (half away from zero from numeric, ``rint`` from floats),
``date ± integer`` within PostgreSQL's dates (date.c), and the comparisons. A value it does not model is
:data:`UNKNOWN`; an error PostgreSQL raises is :class:`PlannerError`.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct

from sqlglot import exp

from airflow_provider_rowfilter.core.filters.constants import NumericFieldOverflow, numeric_typmod
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.spark_sql import MAX_UNIX_DATE, MIN_UNIX_DATE


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()

# int2/int4/int8: bounds and the name their overflow error uses (int.c, int8.c "… out of range")
_INTEGERS = {"int2": (-(2**15), 2**15 - 1, "smallint"), "int4": (-(2**31), 2**31 - 1, "integer"),
             "int8": (-(2**63), 2**63 - 1, "bigint")}
COMPARISONS = {exp.EQ: lambda a, b: a == b, exp.NEQ: lambda a, b: a != b, exp.LT: lambda a, b: a < b,
                exp.LTE: lambda a, b: a <= b, exp.GT: lambda a, b: a > b, exp.GTE: lambda a, b: a >= b}


class PlannerError(Exception):
    """PostgreSQL raises this while folding the filter's constants: for every row."""


def date_arith(op: type, date: object, days: object, right: PgType | None) -> object:
    """``date ± integer`` (date_pli, date_mii): "date out of range" outside PostgreSQL's dates, checked on the exact
    sum; ``date - date`` is not folded here (it cannot fail)."""
    if right is None or not right.is_integer or op not in (exp.Add, exp.Sub) \
            or not isinstance(date, datetime.date) or not isinstance(days, int):
        return UNKNOWN
    day = (datetime.date(date.year, date.month, date.day) - _EPOCH).days + (days if op is exp.Add else -days)
    if not MIN_UNIX_DATE <= day <= MAX_UNIX_DATE:
        raise PlannerError("date out of range")
    try:
        return _EPOCH + datetime.timedelta(days=day)
    except OverflowError:  # a valid PostgreSQL date outside Python's years 1 to 9999: left to Spark
        return UNKNOWN


_EPOCH = datetime.date(1970, 1, 1)


def convert(v: object, own: PgType | None, target: PgType | None) -> object:
    """An implicit coercion's result (these never fail: they widen); UNKNOWN where not modelled."""
    if v is None or v is UNKNOWN or own == target:
        return v
    if own is None or target is None:
        return UNKNOWN
    if own.is_unknown:
        return v  # a literal: the analysis read it in the type it is coerced to
    if own.is_integer and target.is_integer:
        return v
    if own.is_integer and target.name == "numeric":
        return decimal.Decimal(v)  # type: ignore[arg-type]
    if (own.is_integer or own.name == "numeric") and target.name == "float8":
        return _float8(v)
    if own.name == "float4" and target.name == "float8":
        return v
    if own.name == "bpchar" and target.is_text_family and target.name != "bpchar":
        return str(v).rstrip(" ")
    if own.is_text_family and target.is_text_family and target.name != "bpchar":
        return v
    if own.name == target.name and own.name in ("numeric", "bool", "date", "timestamp", "timestamptz", "uuid"):
        return v if own.name != "numeric" or target.precision is None else UNKNOWN
    return UNKNOWN


def _checked_integer(value: int, t: PgType) -> int:
    low, high, name = _INTEGERS[t.name]
    if not low <= value <= high:
        raise PlannerError(f"{name} out of range")
    return value


def cast_value(v: object, source: PgType | None, target: PgType | None) -> object:
    """An explicit cast of a folded value (int.c int42 …, numeric.c numeric_int4, float.c dtoi4 …)."""
    if v is None or v is UNKNOWN:
        return v
    if source is None or target is None:
        return UNKNOWN
    if source.is_integer and target.is_integer:
        return _checked_integer(int(v), target)  # type: ignore[call-overload]
    if source.name == "numeric" and target.is_integer and isinstance(v, decimal.Decimal):
        if not v.is_finite():  # numeric.c numeric_int4_opt_error and kin
            raise PlannerError(f"cannot convert {'NaN' if v.is_nan() else 'infinity'} to {_INTEGERS[target.name][2]}")
        return _checked_integer(int(v.to_integral_value(rounding=decimal.ROUND_HALF_UP)), target)
    if source.name in ("float4", "float8") and target.is_integer and isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise PlannerError(f"{_INTEGERS[target.name][2]} out of range")
        return _checked_integer(round(v), target)  # rint: half to even
    if (source.is_integer or source.name == "numeric") and target.name == "numeric":
        d = decimal.Decimal(v)  # type: ignore[arg-type]
        if target.precision is None:
            return d
        try:
            return numeric_typmod(d, target.precision, target.scale or 0)
        except NumericFieldOverflow as e:
            raise PlannerError(str(e)) from None
    if (source.is_integer or source.name == "numeric") and target.name == "float8":
        return _float8(v)
    if source.name == "float8" and target.name == "float4" and isinstance(v, float):
        return _float4(v)
    return convert(v, source, target)


def _float8(v: object) -> float:
    """numeric or an integer → double precision (numeric.c numeric_float8: NaN and the infinities as they are);
    numeric has no negative zero, so neither has the result."""
    return float(v) + 0.0  # type: ignore[arg-type]


def _float4(v: float) -> object:
    """float8 → real (float.c float84): overflow and underflow raise; the value itself is left unknown."""
    if math.isnan(v) or math.isinf(v):
        return UNKNOWN
    try:
        narrowed = struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        raise PlannerError("value out of range: overflow") from None
    if narrowed == 0.0 and v != 0.0:
        raise PlannerError("value out of range: underflow")
    if math.isinf(narrowed):
        raise PlannerError("value out of range: overflow")
    return UNKNOWN


def arith(op: str, a, b, t: PgType | None) -> object:
    """``a op b`` in ``t`` as PostgreSQL computes it (int.c int4pl … , numeric.c, float.c float8pl …)."""
    if t is None:
        return UNKNOWN
    if t.is_integer:
        a, b = int(a), int(b)
        if op in "/%" and b == 0:
            raise PlannerError("division by zero")
        if op == "/":
            q = abs(a) // abs(b)
            return _checked_integer(q if (a < 0) == (b < 0) else -q, t)
        if op == "%":
            return (abs(a) % abs(b)) * (1 if a >= 0 else -1)  # C's %: the dividend's sign
        return _checked_integer(a + b if op == "+" else a - b if op == "-" else a * b, t)
    if t.name == "numeric":
        da, db = decimal.Decimal(a), decimal.Decimal(b)
        if not (da.is_finite() and db.is_finite()):
            return _special_arith(op, da, db)
        if op in "/%" and db.is_zero():
            raise PlannerError("division by zero")
        if op == "/":
            return UNKNOWN  # refused by the analysis anyway: PostgreSQL picks the scale from the values
        with decimal.localcontext() as ctx:
            ctx.prec = 1000
            result = da + db if op == "+" else da - db if op == "-" else da * db if op == "*" else da.__mod__(db)
        # numeric arithmetic has no typmod: no overflow short of numeric's own limits; and no negative zero
        return result.copy_abs() if result.is_zero() else result
    if t.name == "float8":
        fa: float = float(a)
        fb: float = float(b)
        if op == "/":
            if fb == 0.0 and not math.isnan(fa):
                raise PlannerError("division by zero")
            quotient = fa / fb
            if math.isinf(quotient) and not math.isinf(fa):
                raise PlannerError("value out of range: overflow")
            if quotient == 0.0 and fa != 0.0 and not math.isinf(fb):
                raise PlannerError("value out of range: underflow")
            return quotient
        outcome = fa + fb if op == "+" else fa - fb if op == "-" else fa * fb
        if math.isinf(outcome) and not (math.isinf(fa) or math.isinf(fb)):
            raise PlannerError("value out of range: overflow")
        if op == "*" and outcome == 0.0 and fa != 0.0 and fb != 0.0:
            raise PlannerError("value out of range: underflow")
        return outcome
    return UNKNOWN


_NAN, _INFINITY = decimal.Decimal("NaN"), decimal.Decimal("Infinity")


def _special_arith(op: str, a: decimal.Decimal, b: decimal.Decimal) -> object:
    """numeric arithmetic with NaN or an infinity (numeric.c numeric_add_opt_error, numeric_sub_opt_error,
    numeric_mul_opt_error, numeric_div_opt_error, numeric_mod_opt_error): NaN when either is NaN, Infinity - Infinity,
    Infinity * 0 and Infinity % x; x % ±Infinity is x; an infinity divided by (or modulo) 0 raises."""
    if op in "/%" and not a.is_nan() and not b.is_nan() and a.is_infinite() and b.is_zero():
        raise PlannerError("division by zero")
    if op == "/":
        return UNKNOWN  # refused by the analysis anyway
    if a.is_nan() or b.is_nan():
        return _NAN
    if op == "%":
        return _NAN if a.is_infinite() else a
    if op == "*":
        if a.is_zero() or b.is_zero():
            return _NAN
        return -_INFINITY if a.is_signed() != b.is_signed() else _INFINITY
    if op == "-":
        b = -b
    if a.is_infinite() and b.is_infinite() and a.is_signed() != b.is_signed():
        return _NAN
    return a if a.is_infinite() else b


def numeric_order(d: decimal.Decimal) -> tuple[int, decimal.Decimal]:
    """A numeric's place in numeric_cmp's order (numeric.c cmp_numerics): -Infinity, then the finite values, then
    Infinity, then NaN, which equals itself."""
    if d.is_nan():
        return 2, decimal.Decimal(0)
    if d.is_infinite():
        return (-1 if d.is_signed() else 1), decimal.Decimal(0)
    return 0, d


def comparison(op, a: object, b: object, t: PgType | None) -> object:
    """A comparison of two folded values in ``t`` (NULL in, NULL out); UNKNOWN where not modelled."""
    if a is UNKNOWN or b is UNKNOWN or t is None:
        return UNKNOWN
    if a is None or b is None:
        return None
    if t.name == "numeric":
        return COMPARISONS[op](numeric_order(decimal.Decimal(a)), numeric_order(decimal.Decimal(b)))  # type: ignore[arg-type]
    if t.is_integer or t.name == "bool":
        return COMPARISONS[op](a, b)
    if t.name == "float8" and isinstance(a, float) and isinstance(b, float) and not (math.isnan(a) or math.isnan(b)):
        return COMPARISONS[op](a, b)
    if t.is_text_family and op in (exp.EQ, exp.NEQ):
        if t.name == "bpchar":
            a, b = str(a).rstrip(" "), str(b).rstrip(" ")
        return COMPARISONS[op](a, b)
    return UNKNOWN
