"""Names the user writes (spec ``publications``, ``--table``, operators' ``tables``) read as PostgreSQL reads SQL.

PostgreSQL's lexer (src/backend/parser/scan.l) folds an unquoted identifier to lower case
(``downcase_identifier`` in src/backend/parser/scansup.c: ASCII letters only in a multibyte encoding
such as UTF8), keeps a ``"double-quoted"`` one as written (``""`` inside is one ``"``), and
truncates either to NAMEDATALEN - 1 = 63 bytes (``truncate_identifier``). So ``CREATE PUBLICATION pA``
creates ``pa``, and ``CREATE SUBSCRIPTION … PUBLICATION pA`` finds it; ``"pA"`` names ``pA``.
"""

from __future__ import annotations

import re

from airflow_provider_rowfilter.core.errors import SpecError

NAMEDATALEN = 64
# scan.l: ident_start [A-Za-z\200-\377_], ident_cont [A-Za-z\200-\377_0-9\$]
_UNQUOTED = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z_0-9$\u0080-\U0010ffff]*")
_QUOTED = re.compile(r'"((?:[^"]|"")*)"')
_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")  # what quote_ident leaves unquoted (keywords aside)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _truncated(name: str) -> str:
    """truncate_identifier: at most 63 bytes, cut on a character boundary (pg_mbcliplen)."""
    data = name.encode()
    if len(data) < NAMEDATALEN:
        return name
    return data[:NAMEDATALEN - 1].decode(errors="ignore")


def split_names(text: str, what: str) -> list[str]:
    """The dot-separated identifiers of ``text`` as PostgreSQL reads them (each folded or kept, truncated).

    :raises SpecError: naming ``what``, for text that is not identifiers separated by dots.
    """
    names: list[str] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        quoted = _QUOTED.match(text, pos)
        unquoted = None if quoted else _UNQUOTED.match(text, pos)
        if quoted:
            name = quoted.group(1).replace('""', '"')
            if not name:
                raise SpecError(f'{what}: zero-length delimited identifier in {text!r}',
                                hint='a quoted name needs at least one character between the double quotes')
            names.append(_truncated(name))
            pos = quoted.end()
        elif unquoted:
            names.append(_truncated(unquoted.group(0).translate(_ASCII_LOWER)))
            pos = unquoted.end()
        else:
            raise SpecError(f"{what}: {text!r} is not a name as SQL reads it",
                            hint="write a name of letters, digits, _ and $ (folded to lower case, as PostgreSQL "
                            'folds unquoted names), or double-quote it to keep it as written: \'"My Name"\'')
        while pos < end and text[pos].isspace():
            pos += 1
        if pos == end:
            return names
        if text[pos] != ".":
            raise SpecError(f"{what}: {text!r} is not a name as SQL reads it",
                            hint='double-quote a name with other characters: \'"my name"\'')
        pos += 1


def identifier(text: str, what: str) -> str:
    """One identifier (a publication's name) as PostgreSQL reads it: ``pA`` is ``pa``, ``"pA"`` is ``pA``."""
    names = split_names(text, what)
    if len(names) != 1:
        raise SpecError(f"{what}: {text!r} is not one name", hint='double-quote a name with a dot in it: \'"a.b"\'')
    return names[0]


def quote_identifier(name: str) -> str:
    """``name`` written so that :func:`identifier` reads it back unchanged (quote_ident's rule, keywords aside)."""
    return name if _PLAIN.fullmatch(name) else '"' + name.replace('"', '""') + '"'
