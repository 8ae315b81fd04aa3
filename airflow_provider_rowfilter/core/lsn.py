"""Log sequence numbers: PostgreSQL's ``X/Y`` text form and the 64-bit integer behind it."""

from __future__ import annotations

import re

from airflow_provider_rowfilter.core.errors import RowFilterError

_TEXT = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


def parse_lsn(text: str) -> int:
    """Return the integer of a ``pg_lsn`` text such as ``0/16B3748``."""
    match = _TEXT.match(text or "")
    if match is None:
        raise RowFilterError(f"invalid input syntax for type pg_lsn: {text!r}",
                             hint="an LSN is two hexadecimal numbers separated by a slash, e.g. 0/16B3748")
    return int(match.group(1), 16) << 32 | int(match.group(2), 16)


def format_lsn(lsn: int) -> str:
    """Return the ``pg_lsn`` text of an integer LSN (``%X/%X``, as PostgreSQL prints it)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
