"""What an error about a publications file may quote of it: the SQL statement being parsed, secrets masked.

A spec's ``publications_ddl`` may name a file that is not SQL at all (a configuration file, by mistake or
not), and the errors go to a terminal and to task logs that more people read than the file's owner. So
an error quotes a file only inside a statement that begins as SQL statements do; elsewhere it names the
line and column and quotes nothing. Inside a statement a literal that looks like a secret (a long random
token, or a value next to a word such as ``password`` or ``secret``) is masked, and a token quoted by
PostgreSQL's scanner message (``at or near "…"``) is cut at its first line, where an unterminated
string would otherwise carry the rest of the file into the message.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager

from airflow_provider_rowfilter.core.errors import RowFilterError

#: The words PostgreSQL's SQL commands begin with (the reference's "SQL Commands" list).
STATEMENT_WORDS = frozenset("""
ABORT ALTER ANALYZE BEGIN CALL CHECKPOINT CLOSE CLUSTER COMMENT COMMIT COPY CREATE DEALLOCATE DECLARE DELETE DISCARD
DO DROP END EXECUTE EXPLAIN FETCH GRANT IMPORT INSERT LISTEN LOAD LOCK MERGE MOVE NOTIFY PREPARE REASSIGN REFRESH
REINDEX RELEASE RESET REVOKE ROLLBACK SAVEPOINT SECURITY SELECT SET SHOW START TABLE TRUNCATE UNLISTEN UPDATE VACUUM
VALUES WITH""".split())
MASK = "*"
_SECRET_WORD = re.compile(r"pass|pwd|secret|token|key|credential|auth|salt|private|signature|cookie", re.IGNORECASE)
_TOKEN_LIKE = re.compile(r"^[A-Za-z0-9+/=_\-.~:]{16,}$")
_LITERAL = re.compile(r"(?P<prefix>[A-Za-z_][A-Za-z0-9_]*)?(?P<sep>[^A-Za-z0-9_'\n]*)'(?P<body>(?:[^'\n]|'')*)('|$)",
                      re.MULTILINE)
_NEAR = re.compile(r'(at or near ")(.*?)("(?:\n|$))', re.DOTALL)


def looks_secret(value: str, word: str | None = None) -> bool:
    """Whether a literal ``value`` (after the word ``word``) may be a secret worth masking."""
    if word and _SECRET_WORD.search(word):
        return True
    if not _TOKEN_LIKE.match(value):
        return False
    classes = sum(bool(re.search(p, value)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]", r"[^A-Za-z0-9]"))
    return classes >= 3 or (classes >= 2 and len(value) >= 24)


def mask_secrets(text: str) -> str:
    """``text`` with the body of every quoted literal that :func:`looks_secret` replaced by ``*`` (same length)."""

    def masked(match: re.Match[str]) -> str:
        body = match.group("body")
        if not looks_secret(body, match.group("prefix")):
            return match.group(0)
        start = match.start("body") - match.start(0)
        return match.group(0)[:start] + MASK * len(body) + match.group(0)[start + len(body):]

    return _LITERAL.sub(masked, text)


def statement_span(script: str, position: int) -> tuple[int, int]:
    """The ``[start, end)`` of the statement holding the 0-based ``position``: between top-level semicolons
    (outside quotes and comments), an unterminated quote or comment running to the end."""
    start, i, n = 0, 0, len(script)
    while i < n:
        c = script[i]
        if c == ";":
            if i >= position:
                return start, i + 1
            start = i + 1
        elif c in "'\"":
            close = script.find(c, i + 1)
            i = n if close < 0 else close
        elif script.startswith("--", i):
            newline = script.find("\n", i)
            i = n if newline < 0 else newline
        elif script.startswith("/*", i):
            close = script.find("*/", i + 2)
            i = n if close < 0 else close + 1
        i += 1
    return start, n


def statements(script: str) -> list[tuple[int, int]]:
    """The ``[start, end)`` of every statement of ``script`` (:func:`statement_span`), in order."""
    spans, start = [], 0
    while start < len(script):
        span = statement_span(script, start)
        spans.append(span)
        start = span[1] if span[1] > start else len(script)
    return spans


def first_word(text: str) -> str:
    """The first word of ``text`` after whitespace and comments, upper-cased ('' when there is none)."""
    stripped = re.sub(r"^(?:\s+|--[^\n]*|/\*.*?\*/)*", "", text, flags=re.DOTALL)
    match = re.match(r"[A-Za-z_]+", stripped)
    return match.group(0).upper() if match else ""


def guarded(error: RowFilterError, script: str) -> RowFilterError:
    """``error`` as it may be shown when ``script`` is a file a spec named (see the module's docstring)."""
    if error.source != script:  # a part of a statement the parser recognised (a row filter): masked
        safe = copy.copy(error)
        safe.source = None if error.source is None else mask_secrets(error.source)
        safe.message = _near(error.message)
        return safe
    if error.position is None:  # a parser's error, without a place: the first statement that is not SQL, if any
        offset = next((start for start, end in statements(script)
                       if script[start:end].strip(" \t\r\n;") and first_word(script[start:end]) not in STATEMENT_WORDS),
                      None)
        if offset is None:
            return error
        offset += len(script[offset:]) - len(script[offset:].lstrip())
    else:
        offset = min(max(error.position - 1, 0), len(script))
    start, end = statement_span(script, offset)
    line = script.count("\n", 0, offset) + 1
    column = offset - (script.rfind("\n", 0, offset) + 1) + 1
    if first_word(script[start:end]) not in STATEMENT_WORDS:
        # Not SQL here: neither the scanner's message (it quotes the text) nor the line is shown.
        return type(error)(f"line {line}, column {column} is not in an SQL statement: the file does not look like SQL "
                           "there", publication=error.publication, table=error.table,
                           hint="a publications file holds only CREATE, ALTER and DROP PUBLICATION statements; "
                           "check that publications_ddl names the right file")
    if error.position is None:
        return error
    # Only the statement is quoted: the rest of the script becomes blanks (line breaks kept, so the position holds).
    shown = "".join(ch if ch == "\n" else " " for ch in script[:start]) + mask_secrets(script[start:end])
    shown += "".join(ch if ch == "\n" else " " for ch in script[end:])
    safe = copy.copy(error)
    safe.source, safe.message = shown, _near(error.message)
    return safe


@contextmanager
def quoting_only_sql(script: str) -> Iterator[None]:
    """Raise the errors of the block as :func:`guarded` shows them."""
    try:
        yield
    except RowFilterError as e:
        safe = guarded(e, script)
        if safe is e:
            raise
        raise safe from None


def _near(message: str) -> str:
    """A scanner message's ``at or near "token"`` with the token cut at its first line, masked."""

    def cut(match: re.Match[str]) -> str:
        token = match.group(2)
        first, _, rest = token.partition("\n")
        return f"{match.group(1)}{mask_secrets(first)}{'…' if rest else ''}{match.group(3)}"

    return _NEAR.sub(cut, message)
