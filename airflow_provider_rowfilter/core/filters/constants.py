"""Row filters, constants: a literal's value in its PostgreSQL type, as the type's input function reads it.

PostgreSQL folds a cast of a string literal (or NULL) into a typed constant when it parses the
filter, with the type's input function (int4in, numeric_in, date_in, timestamptz_in …); an unknown
literal coerced to a column's type is read the same way. :func:`constant_value` does that for the
types a filter can hold, raising PostgreSQL's ``invalid input syntax`` text or saying that Spark
cannot hold the value. numeric is read as numeric_in reads it (:func:`numeric_input`: ``NaN``, ``Infinity`` and
``-Infinity`` too) and a typmod applied as apply_typmod does (:func:`numeric_typmod`).
"""

from __future__ import annotations

import decimal
import re
import uuid

import pendulum

from airflow_provider_rowfilter.core.filters.pg_types import PgType


class InvalidConstant(Exception):
    """PostgreSQL's input function refuses the text (its message)."""


class UnrepresentableConstant(Exception):
    """A valid value Spark cannot hold or read exactly: ``what`` cannot be evaluated, ``fix`` says the rewrite."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.what = what
        self.fix = fix


def constant_value(value: object, target: PgType, timezone: str) -> object:
    """Convert a constant to ``target`` as PostgreSQL's input function would, or raise its error.

    ``timezone`` is the publisher's TimeZone, in which a zone-less timestamptz literal is read.
    """
    if value is None:
        return None
    if target.element is not None:
        elements = value if isinstance(value, list) else array_elements(str(value))  # a list: already read
        return [_element_value(v, target.element, timezone) for v in elements]
    text = str(value) if not isinstance(value, bool) else ("true" if value else "false")
    name = target.name
    bad = InvalidConstant(f'invalid input syntax for type {target}: "{text}"')
    try:
        if target.is_integer:
            number = int(text.strip())
            limit = {"int2": 2**15, "int4": 2**31, "int8": 2**63}[name]
            if not -limit <= number < limit:
                raise InvalidConstant(f'value "{text}" is out of range for type {target}')
            return number
        if name == "numeric":  # a typmod's overflow raises NumericFieldOverflow
            d = numeric_input(text)
            return d if target.precision is None else numeric_typmod(d, target.precision, target.scale or 0)
        if name in ("float4", "float8"):
            return float(text)
        if name == "bool":
            lowered = text.strip().lower()
            if lowered in ("t", "true", "y", "yes", "on", "1"):
                return True
            if lowered in ("f", "false", "n", "no", "off", "0"):
                return False
            raise bad
        if name in ("date", "timestamp", "timestamptz"):
            return _datetime_value(text.strip(), target, timezone)
        if name == "uuid":
            return str(uuid.UUID(text.strip()))
        if target.is_text_family:
            # An explicit cast to varchar(n)/character(n) truncates silently (SQL standard);
            # character(n) also pads with spaces.
            if name == "bpchar" and target.precision is not None:
                return text[: target.precision].ljust(target.precision)
            if name == "varchar" and target.precision is not None:
                return text[: target.precision]
            return text
    except (ValueError, decimal.InvalidOperation, pendulum.parsing.exceptions.ParserError) as e:
        raise bad from e
    return value


def _element_value(value: object, element: PgType, timezone: str) -> object:
    """An element of an array constant: a numeric(p,s) element that overflows its typmod is kept as read (the
    typmod is an ArrayCoerceExpr PostgreSQL runs with the filter, and its walker refuses it first)."""
    try:
        return constant_value(value, element, timezone)
    except NumericFieldOverflow:
        return constant_value(value, PgType("numeric"), timezone)


def _datetime_value(text: str, target: PgType, timezone: str) -> object:
    """Read an ISO 8601 date/time literal; a zone-less timestamptz is in the publisher's TimeZone."""
    try:
        parsed = pendulum.parse(text, exact=True, tz=timezone)
    except pendulum.parsing.exceptions.ParserError:
        raise _not_iso(text, target) from None
    if target.name == "date":
        if not isinstance(parsed, pendulum.Date) or isinstance(parsed, pendulum.DateTime):
            raise _not_iso(text, target)
        return parsed
    if isinstance(parsed, pendulum.Date) and not isinstance(parsed, pendulum.DateTime):
        parsed = pendulum.datetime(parsed.year, parsed.month, parsed.day, tz=timezone)
    if not isinstance(parsed, pendulum.DateTime):
        raise _not_iso(text, target)
    if target.name == "timestamp":
        return parsed.naive()
    try:
        return parsed.in_timezone("UTC")
    except OverflowError:  # e.g. '0001-01-01 00:00+02', which is in 1 BC in UTC
        raise UnrepresentableConstant(
            f"the {target} literal {text!r}",
            "Spark holds timestamps from year 1 to 9999 (UTC); use a value inside that range") from None


def _not_iso(text: str, target: PgType) -> UnrepresentableConstant:
    return UnrepresentableConstant(
        f"the {target} literal {text!r}",
        "write dates and timestamps in ISO 8601 form, e.g. '2024-01-31' or '2024-01-31 12:00:00+00'")


# numeric_in's special values (numeric.c): NaN without a sign, [+-]Infinity or [+-]inf, any letter case, surrounded
# by the whitespace isspace() skips
_NUMERIC_SPECIAL = re.compile(r"[ \t\n\r\v\f]*(?:(nan)|([+-]?)(infinity|inf))[ \t\n\r\v\f]*", re.IGNORECASE)
_PYTHON_ONLY_SPECIAL = re.compile(r"[+-]?s?nan", re.IGNORECASE)


def numeric_input(text: str) -> decimal.Decimal:
    """numeric_in (numeric.c) without a typmod: a number, or ``NaN``, ``Infinity`` or ``-Infinity`` (PostgreSQL 14 on).
    numeric has no negative zero (``'-0'`` is 0). Raises ValueError for what numeric_in refuses."""
    special = _NUMERIC_SPECIAL.fullmatch(text)
    if special is not None:
        if special.group(1):
            return decimal.Decimal("NaN")
        return decimal.Decimal("-Infinity" if special.group(2) == "-" else "Infinity")
    stripped = text.strip(" \t\n\r\v\f")
    # Python's Decimal also reads sNaN, a signed NaN, other infinity spellings and non-ASCII digits and spaces
    if not stripped.isascii() or _PYTHON_ONLY_SPECIAL.match(stripped) or re.match(r"[+-]?inf", stripped, re.IGNORECASE):
        raise ValueError(text)
    d = decimal.Decimal(stripped)
    return d.copy_abs() if d.is_zero() else d


class NumericFieldOverflow(Exception):
    """apply_typmod / apply_typmod_special (numeric.c) refuse the value for numeric(p,s): ``numeric field overflow``,
    with PostgreSQL's DETAIL (``detail``)."""

    def __init__(self, detail: str) -> None:
        super().__init__("numeric field overflow")
        self.detail = detail


def numeric_typmod(d: decimal.Decimal, precision: int, scale: int) -> decimal.Decimal:
    """``d`` as numeric(precision, scale) holds it (numeric.c apply_typmod, apply_typmod_special): rounded half away
    from zero to ``scale`` digits; NaN as it is; an infinity, or a value that needs more than ``precision - scale``
    integer digits, raises NumericFieldOverflow."""
    if d.is_nan():
        return d
    if d.is_infinite():
        raise NumericFieldOverflow(f"A field with precision {precision}, scale {scale} cannot hold an infinite value.")
    with decimal.localcontext() as ctx:
        ctx.prec = 1000
        rounded = d.quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP)
    digits = precision - scale
    if not rounded.is_zero() and rounded.adjusted() >= digits:
        limit = f"10^{digits}" if digits > 0 else "1"
        raise NumericFieldOverflow(f"A field with precision {precision}, scale {scale} must round to an absolute value "
                                   f"less than {limit}.")
    return rounded.copy_abs() if rounded.is_zero() else rounded


def decimal_type(value: decimal.Decimal) -> PgType:
    """The narrowest numeric(p,s) that holds ``value`` exactly: numeric(1,0) for NaN and the infinities, which need
    no digit (the Spark value holds them beside its decimal, core/filters/spark_numeric.py)."""
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        return PgType("numeric", 1, 0)
    scale = max(-exponent, 0)
    integer_digits = max(len(digits) + exponent, 0)
    return PgType("numeric", max(integer_digits + scale, 1), scale)



# array_isspace (arrayfuncs.c): the whitespace array_in skips around elements and braces
_ARRAY_SPACE = " \t\n\r\v\f"


def array_elements(text: str) -> list[str | None]:
    """The elements of an array's text form as array_in (arrayfuncs.c ``ReadArrayStr``) reads them, every
    dimension in storage order (what ``op ANY/ALL`` walks): ``{…}`` nested, rectangular; an element double-quoted
    (a backslash takes the next character as it is) or unquoted (backslashes likewise, surrounding whitespace
    dropped, ``NULL`` in any case is NULL). Raises InvalidConstant with PostgreSQL's ``malformed array literal``
    (its primary message; the DETAIL is left out), or UnrepresentableConstant for explicit bounds (``[0:1]={…}``),
    which are not read here."""
    malformed = InvalidConstant(f'malformed array literal: "{text}"')
    i, n = 0, len(text)

    def skip_space() -> None:
        nonlocal i
        while i < n and text[i] in _ARRAY_SPACE:
            i += 1

    skip_space()
    if i < n and text[i] == "[":
        raise UnrepresentableConstant("an array literal with explicit bounds",
                                      "write the array without its bounds, e.g. '{1,2}'")
    elements: list[str | None] = []

    def read(depth: int) -> tuple[int, ...]:
        """Read one ``{…}`` at text[i]; return its shape (the lengths of each dimension)."""
        nonlocal i
        if depth > 6 or i >= n or text[i] != "{":
            raise malformed
        i += 1
        skip_space()
        shapes: list[tuple[int, ...]] = []
        count = 0
        if i < n and text[i] == "}":
            i += 1
            return (0,)
        while True:
            skip_space()
            if i < n and text[i] == "{":
                shapes.append(read(depth + 1))
            else:
                elements.append(element())
                shapes.append(())
            count += 1
            skip_space()
            if i < n and text[i] == ",":
                i += 1
                continue
            if i < n and text[i] == "}":
                i += 1
                break
            raise malformed
        if len(set(shapes)) != 1 or shapes[0] == (0,):
            raise malformed  # sub-arrays of different dimensions, elements beside sub-arrays, or an empty {}
        return (count, *shapes[0])

    def element() -> str | None:
        nonlocal i
        out: list[str] = []
        if i < n and text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                    if i >= n:
                        raise malformed
                out.append(text[i])
                i += 1
            if i >= n:
                raise malformed
            i += 1
            return "".join(out)
        kept = 0  # the length up to the last escaped or non-space character: trailing whitespace goes
        escaped = False
        while i < n and text[i] not in ',{}"':
            if text[i] == "\\":
                i += 1
                if i >= n:
                    raise malformed
                escaped = True
                out.append(text[i])
                kept = len(out)
            else:
                out.append(text[i])
                if text[i] not in _ARRAY_SPACE:
                    kept = len(out)
            i += 1
        if i < n and text[i] in '{"':
            raise malformed
        value = "".join(out[:kept])
        if not value and not escaped:
            raise malformed
        return None if not escaped and value.upper() == "NULL" else value

    shape = read(0)
    skip_space()
    if i != n or (len(shape) > 1 and 0 in shape):
        raise malformed
    return elements


_HEX = frozenset("0123456789abcdefABCDEF")


def unicode_escapes(body: str, escape: str = "\\") -> str:
    """The value of ``U&'body'`` [``UESCAPE 'escape'``] as parser.c ``str_udeescape`` decodes it: ``\\XXXX`` and
    ``\\+XXXXXX`` code points (a UTF-16 surrogate pair as two escapes), the escape character doubled for
    itself. Raises InvalidConstant(message, hint) with PostgreSQL's texts."""
    if len(escape) != 1 or escape in _HEX or escape in "+'\" \t\n\r\f":
        raise InvalidConstant(f"invalid Unicode escape character at or near \"'{escape}'\"")
    out: list[str] = []
    pending_high: int | None = None
    i = 0
    while i < len(body):
        if body[i] != escape:
            if pending_high is not None:
                raise InvalidConstant("invalid Unicode surrogate pair")
            out.append(body[i])
            i += 1
            continue
        if body[i + 1:i + 2] == escape:
            if pending_high is not None:
                raise InvalidConstant("invalid Unicode surrogate pair")
            out.append(escape)
            i += 2
            continue
        if len(body[i + 1:i + 5]) == 4 and set(body[i + 1:i + 5]) <= _HEX:
            code, i = int(body[i + 1:i + 5], 16), i + 5
        elif body[i + 1:i + 2] == "+" and len(body[i + 2:i + 8]) == 6 and set(body[i + 2:i + 8]) <= _HEX:
            code, i = int(body[i + 2:i + 8], 16), i + 8
        else:
            raise InvalidConstant("invalid Unicode escape", "Unicode escapes must be \\XXXX or \\+XXXXXX.")
        if pending_high is not None:
            if not 0xDC00 <= code <= 0xDFFF:
                raise InvalidConstant("invalid Unicode surrogate pair")
            code, pending_high = 0x10000 + ((pending_high & 0x3FF) << 10) + (code & 0x3FF), None
        elif 0xD800 <= code <= 0xDBFF:
            pending_high = code
            continue
        elif 0xDC00 <= code <= 0xDFFF:
            raise InvalidConstant("invalid Unicode surrogate pair")
        if not 0 < code <= 0x10FFFF:
            raise InvalidConstant("invalid Unicode escape value")
        out.append(chr(code))
    if pending_high is not None:
        raise InvalidConstant("invalid Unicode surrogate pair")
    return "".join(out)
