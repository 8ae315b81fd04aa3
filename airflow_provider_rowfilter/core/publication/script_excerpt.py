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
from dataclasses import dataclass

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
_NEAR = re.compile(r'(at or near ")(.*?)("(?:\n|$))', re.DOTALL)


def looks_secret(value: str, word: str | None = None) -> bool:
    """Whether a literal ``value`` (after the word ``word``) may be a secret worth masking."""
    if word and _SECRET_WORD.search(word):
        return True
    if not _TOKEN_LIKE.match(value):
        return False
    classes = sum(bool(re.search(p, value)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]", r"[^A-Za-z0-9]"))
    return classes >= 3 or (classes >= 2 and len(value) >= 24)


@dataclass(frozen=True)
class Quoted:
    """One quoted token of SQL text (or a comment): ``[start, end)`` whole, ``[body, body_end)`` inside the quotes,
    ``word`` the identifier just before it, if any (what :func:`looks_secret` weighs)."""

    start: int
    end: int
    body: int
    body_end: int
    kind: str  # "string", "identifier", "comment"
    word: str | None = None


#: The identifier characters of PostgreSQL's scanner (scan.l ``ident_start``/``ident_cont``; bytes 0x80-0xFF are
#: letters there, so is every non-ASCII character here).
_IDENT = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_\u0080-\U0010ffff]*)?\$")
#: The words of a quoted value or a comment that :func:`mask_secrets` weighs one by one.
_WORD = re.compile(r"[^\s'\"\\;,()]+")
_NUMBER = re.compile(r"[0-9A-Za-z_.$]+")
#: String prefixes of scan.l: ``E'…'`` (backslash escapes), ``U&'…'``, ``B'…'``, ``X'…'``, ``N'…'``; ``U&"…"``.
_PREFIXES = frozenset({"e", "b", "x", "n", "u&"})


def quoted_tokens(text: str) -> Iterator[Quoted]:
    """Every quoted token and comment of ``text`` in order, read as PostgreSQL's scanner reads them
    (src/backend/parser/scan.l): ``'…'`` with ``''``; ``E'…'`` with backslash escapes too; ``U&'…'``, ``B'…'``,
    ``X'…'``, ``N'…'``; ``$tag$…$tag$`` (not inside an identifier: ``a$b$`` is one); ``"…"`` and ``U&"…"`` with
    ``""``; ``--`` comments and nested ``/* */`` ones. An unterminated one runs to the end of ``text``."""
    i, n, word = 0, len(text), None
    while i < n:
        c = text[i]
        if c in " \t\r\n\f\v":
            i += 1
            continue
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            yield Quoted(i, end, i + 2, end, "comment")
            i = end
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            yield Quoted(i, j, i + 2, j - 2 if not depth else j, "comment")
            i = j
            continue
        ident = _IDENT.match(text, i)
        if ident is not None:
            name = ident.group(0)
            prefix = name.lower()
            if prefix == "u" and text.startswith("&", ident.end()) and text[ident.end() + 1: ident.end() + 2] in "'\"":
                prefix, after = "u&", ident.end() + 1
            else:
                after = ident.end()
            if prefix in _PREFIXES and after < n and (text[after] == "'" or prefix == "u&"):
                token = _quoted_at(text, after, escapes=prefix == "e", start=i)
                yield Quoted(token.start, token.end, token.body, token.body_end, token.kind, word)
                i, word = token.end, None
                continue
            word, i = name, ident.end()
            continue
        if c in "'\"":
            token = _quoted_at(text, i, escapes=False, start=i)
            yield Quoted(token.start, token.end, token.body, token.body_end, token.kind, word)
            i, word = token.end, None
            continue
        if c == "$":
            tag = _DOLLAR_TAG.match(text, i)
            if tag is not None:
                close = text.find(tag.group(0), tag.end())
                end = n if close < 0 else close + len(tag.group(0))
                yield Quoted(i, end, tag.end(), n if close < 0 else close, "string", word)
                i, word = end, None
                continue
        if c.isdigit():  # a number, and whatever of an identifier follows it: not a quote's start
            i = _NUMBER.match(text, i).end()  # type: ignore[union-attr]  # it matches the digit at least
            continue
        i += 1


def _quoted_at(text: str, i: int, *, escapes: bool, start: int) -> Quoted:
    """The ``'…'`` or ``"…"`` opening at ``i``: the quote doubled inside, and with ``escapes`` a backslash escape."""
    quote, j, n = text[i], i + 1, len(text)
    while j < n:
        c = text[j]
        if escapes and c == "\\":
            j += 2
            continue
        if c == quote:
            if text.startswith(quote, j + 1):
                j += 2
                continue
            return Quoted(start, j + 1, i + 1, j, "string" if quote == "'" else "identifier")
        j += 1
    return Quoted(start, n, i + 1, n, "string" if quote == "'" else "identifier")


def mask_secrets(text: str) -> str:
    """``text`` with every quoted string or identifier whose value :func:`looks_secret` masked by ``*`` (same
    length, line breaks kept), in every quoting form of PostgreSQL's scanner (:func:`quoted_tokens`); of one that
    does not (``E'Bearer …'``, an unterminated one running on), and of a comment, the words that look secret."""
    masked = list(text)
    for token in quoted_tokens(text):
        body = text[token.body:token.body_end]
        words = [(m.start(), m.end()) for m in _WORD.finditer(body)]
        if token.kind != "comment" and looks_secret(body, token.word):
            spans = [(0, len(body))]
        else:
            spans = [(a, b) for a, b in words if looks_secret(body[a:b])]
        for a, b in spans:
            for k in range(token.body + a, token.body + b):
                if masked[k] != "\n":
                    masked[k] = MASK
    return "".join(masked)


def statement_span(script: str, position: int) -> tuple[int, int]:
    """The ``[start, end)`` of the statement holding the 0-based ``position``: between top-level semicolons
    (outside quotes and comments: :func:`quoted_tokens`), an unterminated quote or comment running to the end."""
    start, i, n = 0, 0, len(script)
    tokens = quoted_tokens(script)
    token = next(tokens, None)
    while i < n:
        if token is not None and i >= token.start:
            i = token.end
            token = next(tokens, None)
            continue
        if script[i] == ";":
            if i >= position:
                return start, i + 1
            start = i + 1
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
