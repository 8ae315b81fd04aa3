"""Row filters, constants: a literal's value in its PostgreSQL type, as the type's input function reads it.

PostgreSQL folds a cast of a string literal (or NULL) into a typed constant when it parses the
filter, with the type's input function (int4in, numeric_in, date_in, timestamptz_in …); an unknown
literal coerced to a column's type is read the same way. :func:`constant_value` does that for the
types a filter can hold, raising PostgreSQL's ``invalid input syntax`` text or saying that Spark
cannot hold the value.
"""

from __future__ import annotations

import decimal
import uuid

import pendulum

from airflow_provider_rowfilter.core.filters import pg_types as T
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
        if isinstance(value, list):  # an array constant, already read: its elements converted
            return [constant_value(v, target.element, timezone) for v in value]
        return [constant_value(v, target.element, timezone) for v in array_elements(str(value))]
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
        if name == "numeric":
            d = decimal.Decimal(text.strip())
            if target.scale is not None:
                d = d.quantize(decimal.Decimal(1).scaleb(-target.scale), rounding=decimal.ROUND_HALF_UP)
            return d
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


def decimal_type(value: decimal.Decimal) -> PgType:
    """The narrowest numeric(p,s) that holds ``value`` exactly."""
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        return T.NUMERIC
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
