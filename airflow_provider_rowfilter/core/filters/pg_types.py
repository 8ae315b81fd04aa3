"""The PostgreSQL types a row filter can use, their Spark counterparts, and how they combine.

Only types whose values Spark holds exactly are mapped; everything else is named in a clear
error by the translator. ``format_type()`` text (what the catalog reports) is the input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Integer widths in PostgreSQL's order of promotion.
INTEGER_TYPES = ("int2", "int4", "int8")
SPARK_MAX_DECIMAL_PRECISION = 38

# Collations whose ordering is byte/code-point order, which is what Spark's UTF8_BINARY compares.
BINARY_ORDER_COLLATIONS = frozenset({"C", "POSIX", "C.UTF-8", "C.utf8", "ucs_basic", "pg_c_utf8"})


@dataclass(frozen=True)
class PgType:
    """A PostgreSQL type in canonical internal name (``int4``, ``numeric``, ``bpchar`` …)."""

    name: str
    precision: int | None = None  # numeric precision, or character length for varchar/bpchar
    scale: int | None = None
    element: PgType | None = None  # for arrays

    def __str__(self) -> str:
        return display_name(self)

    @property
    def is_integer(self) -> bool:
        return self.name in INTEGER_TYPES

    @property
    def is_numeric_family(self) -> bool:
        return self.name in INTEGER_TYPES or self.name in ("numeric", "float4", "float8")

    @property
    def is_text_family(self) -> bool:
        return self.name in ("text", "varchar", "bpchar", "name")

    @property
    def is_unknown(self) -> bool:
        return self.name == "unknown"


UNKNOWN = PgType("unknown")
BOOL = PgType("bool")
INT2, INT4, INT8 = PgType("int2"), PgType("int4"), PgType("int8")
NUMERIC = PgType("numeric")
FLOAT4, FLOAT8 = PgType("float4"), PgType("float8")
TEXT = PgType("text")
DATE, TIMESTAMP, TIMESTAMPTZ = PgType("date"), PgType("timestamp"), PgType("timestamptz")
UUID = PgType("uuid")
# The type of nodes the row-filter walker rejects anyway (system columns, subqueries, whole-row references):
# PostgreSQL resolves their operators, so analysis must not fail on them first.
ANY = PgType("any")

_DISPLAY = {
    "int2": "smallint", "int4": "integer", "int8": "bigint", "float4": "real",
    "float8": "double precision", "bool": "boolean", "varchar": "character varying",
    "bpchar": "character", "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone", "unknown": "unknown",
}

_ALIASES = {
    "smallint": "int2", "int2": "int2", "integer": "int4", "int": "int4", "int4": "int4",
    "bigint": "int8", "int8": "int8", "real": "float4", "float4": "float4",
    "double precision": "float8", "float8": "float8", "float": "float8", "numeric": "numeric",
    "decimal": "numeric", "boolean": "bool", "bool": "bool", "text": "text",
    "character varying": "varchar", "varchar": "varchar", "character": "bpchar", "char": "bpchar",
    "bpchar": "bpchar", "name": "name", "date": "date", "timestamp without time zone": "timestamp",
    "timestamp": "timestamp", "timestamp with time zone": "timestamptz", "timestamptz": "timestamptz",
    "uuid": "uuid", "json": "json", "jsonb": "jsonb", "bytea": "bytea", "interval": "interval",
    "time without time zone": "time", "time": "time", "time with time zone": "timetz",
    "oid": "oid", "inet": "inet", "cidr": "cidr", "money": "money", "xml": "xml",
}

_TYPE_RE = re.compile(r"^(?P<base>[a-z ]+?)\s*(?:\((?P<args>[\d,\s]+)\))?(?P<tz> with(?:out)? time zone)?(?P<array>(\[\])*)$")


def display_name(t: PgType) -> str:
    """Name a type the way PostgreSQL's messages do (``integer``, ``character varying``)."""
    if t.element is not None:
        return f"{display_name(t.element)}[]"
    return _DISPLAY.get(t.name, t.name)


def parse_type(text: str) -> PgType:
    """Parse ``format_type()`` output or a cast target (``numeric(10,2)``, ``integer[]``)."""
    raw = text.strip().lower().strip('"')
    if raw.startswith("pg_catalog."):
        raw = raw[len("pg_catalog."):]
    m = _TYPE_RE.match(raw)
    if not m:
        return PgType(raw)
    base = m.group("base").strip()
    if m.group("tz"):
        base = f"{base}{m.group('tz')}"
    name = _ALIASES.get(base, base)
    args = [int(a) for a in (m.group("args") or "").replace(" ", "").split(",") if a]
    precision = args[0] if args else None
    scale = args[1] if len(args) > 1 else (0 if name == "numeric" and args else None)
    if name == "bpchar" and precision is None and base in ("character", "char"):
        precision = 1  # "character" alone means character(1)
    result = PgType(name, precision, scale)
    for _ in range(m.group("array").count("[]")):
        result = PgType("_array", element=result)
    return result


def integer_literal_type(value: int) -> PgType:
    """PostgreSQL types an integer literal as int4, else int8, else numeric."""
    if -(2**31) <= value < 2**31:
        return INT4
    if -(2**63) <= value < 2**63:
        return INT8
    return PgType("numeric", len(str(abs(value))), 0)


def numeric_common(left: PgType, right: PgType) -> PgType | None:
    """The type PostgreSQL computes a binary numeric operator in, or None when not both numeric."""
    if not (left.is_numeric_family and right.is_numeric_family):
        return None
    names = {left.name, right.name}
    if "float8" in names or ("float4" in names and names != {"float4"}):
        return FLOAT8
    if names == {"float4"}:
        return FLOAT4
    if "numeric" in names:
        return NUMERIC
    return max((left, right), key=lambda t: INTEGER_TYPES.index(t.name))


def numeric_holding(left: PgType, right: PgType) -> PgType:
    """numeric with the smallest precision and scale that hold both sides exactly (integers by their digits);
    unconstrained when one side is."""
    def bounds(t: PgType) -> tuple[int | None, int]:
        if t.name == "numeric":
            return (None if t.precision is None else t.precision - (t.scale or 0)), t.scale or 0
        return {"int2": 5, "int4": 10, "int8": 19}[t.name], 0
    (li, ls), (ri, rs) = bounds(left), bounds(right)
    if li is None or ri is None:
        return NUMERIC
    scale = max(ls, rs)
    return PgType("numeric", max(li, ri) + scale, scale)


def spark_decimal(t: PgType) -> str:
    """The DECIMAL of numeric(p,s) ``t``: the finite values of its Spark struct (:func:`spark_type`)."""
    return f"DECIMAL({t.precision},{t.scale or 0})"


def spark_type(t: PgType) -> str | None:
    """The Spark SQL type that holds this PostgreSQL type exactly, or None. numeric(p,s) is a DECIMAL beside a
    DOUBLE that says whether the value is NaN or an infinity (core/filters/spark_numeric.py)."""
    if t.element is not None:
        inner = spark_type(t.element)
        return f"ARRAY<{inner}>" if inner else None
    if t.name == "numeric":
        if t.precision is None or t.precision > SPARK_MAX_DECIMAL_PRECISION:
            return None
        return f"STRUCT<k: DOUBLE, v: {spark_decimal(t)}>"
    return {
        "bool": "BOOLEAN", "int2": "SMALLINT", "int4": "INT", "int8": "BIGINT",
        "float4": "FLOAT", "float8": "DOUBLE", "text": "STRING", "varchar": "STRING",
        "bpchar": "STRING", "name": "STRING", "date": "DATE", "timestamp": "TIMESTAMP_NTZ",
        "timestamptz": "TIMESTAMP", "uuid": "STRING", "json": "STRING", "jsonb": "STRING",
    }.get(t.name)
