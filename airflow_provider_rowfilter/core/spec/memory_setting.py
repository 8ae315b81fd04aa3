"""A memory setting of PostgreSQL's, read and refused as PostgreSQL reads and refuses it: the spec's
``logical_decoding_work_mem``, set for the capture's session on the publisher (publisher/capture.py).

PostgreSQL reads an integer setting whose unit is kB (``logical_decoding_work_mem``: ``GUC_UNIT_KB``, min 64,
max ``MAX_KILOBYTES``; src/backend/utils/misc/guc_tables.c) with ``parse_int`` (src/backend/utils/misc/guc.c):
an integer (decimal, octal with a leading 0, hex with 0x) or a number with a fraction or exponent, then an
optional unit among ``B``, ``kB``, ``MB``, ``GB``, ``TB`` (case-sensitive, units of 1024; without one, kB),
rounded to whole kB; ``parse_and_validate_value`` then refuses a value outside the range, with the messages
below. A YAML integer is such a number without a unit: kB, as in postgresql.conf.
"""

from __future__ import annotations

import re

from airflow_provider_rowfilter.core.errors import SpecError

#: PostgreSQL's memory units for a setting in kB (memory_unit_conversion_table in guc.c).
_KB_PER_UNIT = {"TB": 1024.0 ** 3, "GB": 1024.0 ** 2, "MB": 1024.0, "kB": 1.0, "B": 1.0 / 1024}
_UNITS_HINT = 'Valid units for this parameter are "B", "kB", "MB", "GB", and "TB".'
_INT_MAX = 2**31 - 1
#: logical_decoding_work_mem's range in kB (guc_tables.c: 64 .. MAX_KILOBYTES, INT_MAX on 64-bit servers).
DECODING_WORK_MEM_RANGE = (64, _INT_MAX)
#: strtol(…, 0)'s integer (hex with 0x, octal with a leading 0, else decimal), and strtod's number.
_INTEGER = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def memory_kb(value: str | int, name: str, minimum: int, maximum: int, where: str) -> int:
    """``value`` in kB, as PostgreSQL reads a setting ``name`` in kB; refused with PostgreSQL's message.

    :param where: what the refusal names first (the spec's key and subscription).
    :raises SpecError: the value is not one PostgreSQL accepts for ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise SpecError(f'{where}: invalid value for parameter "{name}": {value!r}',
                        hint="write a size as postgresql.conf does: '256MB', '1GB', or kB without a unit")
    kb = value if isinstance(value, int) else _parse(value, name, where)
    if not minimum <= kb <= maximum:
        raise SpecError(f'{where}: {kb} kB is outside the valid range for parameter "{name}" '
                        f"({minimum} kB .. {maximum} kB)",
                        hint=f"write a size from {minimum}kB to {maximum}kB ('256MB', '1GB'), or leave it out for the "
                        "server's own")
    return kb


def _parse(text: str, name: str, where: str) -> int:
    """``parse_int`` of guc.c for a setting in kB: the number, its unit, rounded to whole kB (halves to even, rint)."""
    stripped = text.lstrip()  # strtol and strtod skip leading white space
    number = _INTEGER.match(stripped)
    value: float
    if number is not None and stripped[number.end():number.end() + 1] not in (".", "e", "E"):
        digits = number.group().lstrip("+-")
        base = 16 if digits[:2] in ("0x", "0X") else 8 if digits.startswith("0") else 10
        value = (-1 if number.group().startswith("-") else 1) * int(digits, base)
        rest = stripped[number.end():]
    else:  # a fraction or an exponent: read again as a float (strtod)
        floating = _FLOAT.match(stripped)
        if floating is None:
            raise _invalid(text, name, where, None)
        value = float(floating.group())
        rest = stripped[floating.end():]
    unit = rest.strip()
    if unit:
        if unit not in _KB_PER_UNIT:  # an unknown unit, or anything after one
            raise _invalid(text, name, where, _UNITS_HINT)
        value *= _KB_PER_UNIT[unit]
    rounded = round(value)
    if not -_INT_MAX - 1 <= rounded <= _INT_MAX:
        raise _invalid(text, name, where, "Value exceeds integer range.")
    return rounded


def _invalid(text: str, name: str, where: str, hint: str | None) -> SpecError:
    return SpecError(f'{where}: invalid value for parameter "{name}": "{text}"',
                     hint=hint or "write a size as postgresql.conf does: '256MB', '1GB', or kB without a unit")
