"""PostgreSQL's lexical rules (src/backend/parser/scan.l), where sqlglot's tokenizer reads differently.

sqlglot treats every Unicode space as whitespace, decodes ``E'…'`` escapes its own way, splits
``'a'<newline>'b'`` and ``1_000``, and raises bare ``TokenError`` for an unterminated literal.
PostgreSQL's scanner is the specification: :func:`scan` walks the text as scan.l does and raises
its errors (text, position); :func:`reconcile` then corrects sqlglot's tokens to PostgreSQL's
(identifiers holding Unicode spaces, string values, continued strings), so the parser builds the tree
PostgreSQL would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot.tokens import Token, TokenType

from airflow_provider_rowfilter.core.errors import PublicationError, PublicationSyntaxError

#: scan.l ``space``: PostgreSQL 16 added ``\v``; PostgreSQL 15 reads it as an unknown character.
SPACE = " \t\n\r\f\v"
SPACE_PG15 = " \t\n\r\f"
_HORIZ = " \t\f\v"

# scan.l {ident_start} [A-Za-z\200-\377_], {ident_cont} adds [0-9\$]; every non-ASCII character of
# a UTF-8 text is made of bytes \200-\377, so it is an identifier character, Unicode spaces included.
_IDENT = re.compile(r"[A-Za-z_\x80-\U0010FFFF][A-Za-z_0-9$\x80-\U0010FFFF]*")
_DOLQ = re.compile(r"\$([A-Za-z_\x80-\U0010FFFF][A-Za-z_0-9\x80-\U0010FFFF]*)?\$")
_PARAM = re.compile(r"\$[0-9]+")
# Numbers (scan.l decinteger, hexinteger, octinteger, bininteger, numeric, real): PostgreSQL 16 added
# the 0x/0o/0b integers and the underscores between digits.
_NUMBER = re.compile(
    r"0[xX](?:_?[0-9A-Fa-f])+|0[oO](?:_?[0-7])+|0[bB](?:_?[01])+"
    r"|(?:[0-9](?:_?[0-9])*(?:\.(?:[0-9](?:_?[0-9])*)?)?|\.[0-9](?:_?[0-9])*)(?:[Ee][-+]?[0-9](?:_?[0-9])*)?"
)
_NUMBER_PG15 = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[Ee][-+]?[0-9]+)?")
_OPERATOR_OR_SELF = set(",()[].;:+-*/%^<>=~!@#&|`?")
_UNTERMINATED = {"'": "unterminated quoted string", "e": "unterminated quoted string",
                 "n": "unterminated quoted string", "u": "unterminated quoted string",
                 "b": "unterminated bit string literal", "x": "unterminated hexadecimal string literal"}


@dataclass(frozen=True)
class PgToken:
    """A token as scan.l delimits it: ``kind`` ident, qident, string, dollar, number, param or other."""

    kind: str
    start: int  # first character
    end: int  # one past the last character
    value: str | None = None  # identifiers: the text; strings: the decoded value (plain and E only)


_CLOSE = {
    "unterminated quoted string": "close the string with ' (a quote inside it is written '')",
    "unterminated bit string literal": "close the bit string with '",
    "unterminated hexadecimal string literal": "close the hexadecimal string with '",
    "unterminated /* comment": "close the comment with */ (comments nest: each /* needs its own */)",
    "unterminated quoted identifier": 'close the name with " (a quote inside it is written "")',
    "unterminated dollar-quoted string": "close the string with the same $tag$ that opens it",
}


def _near(sql: str, start: int, message: str) -> PublicationSyntaxError:
    """scanner_yyerror: a literal left open runs to the end of the input, which is what "near" shows."""
    return PublicationSyntaxError(f'{message} at or near "{sql[start:]}"', source=sql, position=start + 1,
                                  hint=_CLOSE[message])


def scan(sql: str, *, server_version_num: int = 180000) -> list[PgToken]:
    """The identifiers, literals and unknown characters of ``sql`` as PostgreSQL's scanner reads them.

    Raises PostgreSQL's lexical errors: unterminated literals and comments, a zero-length quoted
    identifier, trailing junk after a number, bad escapes in ``E'…'``. ``server_version_num`` is the
    publisher's: PostgreSQL 16 changed what is whitespace and what is a number.
    """
    pg16 = server_version_num >= 160000
    space, number = (SPACE, _NUMBER) if pg16 else (SPACE_PG15, _NUMBER_PG15)
    tokens: list[PgToken] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        two = sql[i : i + 2]
        if c in space:
            i += 1
        elif two == "--":
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif two == "/*":
            i = _comment_end(sql, i)
        elif c == "'" or (c in "eEnNbBxX" and sql[i + 1 : i + 2] == "'") or (
                c in "uU" and sql[i + 1 : i + 3] == "&'"):
            kind = "'" if c == "'" else c.lower()
            quote = i + (0 if c == "'" else 2 if kind == "u" else 1)
            end, value = _string(sql, i, quote, kind, space)
            tokens.append(PgToken("string", i, end, value))
            i = end
        elif c == '"' or (c in "uU" and sql[i + 1 : i + 3] == '&"'):
            quote = i if c == '"' else i + 2
            end = quote + 1
            while True:
                end = sql.find('"', end)
                if end < 0:
                    raise _near(sql, i, "unterminated quoted identifier")
                if sql[end + 1 : end + 2] != '"':
                    break
                end += 2
            if end == quote + 1:
                raise PublicationSyntaxError('zero-length delimited identifier at or near """"', source=sql,
                                             position=i + 1, hint='write a name between the double quotes')
            tokens.append(PgToken("qident", i, end + 1))
            i = end + 1
        elif c == "$" and (m := _DOLQ.match(sql, i)):
            close = sql.find(m.group(0), m.end())
            if close < 0:
                raise _near(sql, i, "unterminated dollar-quoted string")
            tokens.append(PgToken("dollar", i, close + len(m.group(0)), sql[m.end() : close]))
            i = close + len(m.group(0))
        elif c == "$" and (m := _PARAM.match(sql, i)):
            tokens.append(PgToken("param", i, m.end()))
            i = m.end()
        elif c.isdigit() and c.isascii() or (c == "." and sql[i + 1 : i + 2].isdigit()):
            m = number.match(sql, i)
            assert m is not None  # a digit, or a point and a digit, always starts a number
            junk = _IDENT.match(sql, m.end())
            if junk:
                raise PublicationSyntaxError(
                    f'trailing junk after numeric literal at or near "{sql[i : junk.end()]}"', source=sql,
                    position=i + 1, hint="put an ordinary space after the number (PostgreSQL reads a letter or "
                    "any non-ASCII character, a Unicode space too, as part of the number)")
            tokens.append(PgToken("number", i, m.end(), m.group(0)))
            i = m.end()
        elif m := _IDENT.match(sql, i):
            tokens.append(PgToken("ident", i, m.end(), m.group(0)))
            i = m.end()
        elif c in _OPERATOR_OR_SELF or c == "$":
            i += 1
        else:  # scan.l's `other`: a one-character token no grammar rule takes
            tokens.append(PgToken("other", i, i + 1, c))
            i += 1
    return tokens


def _comment_end(sql: str, start: int) -> int:
    """scan.l ``xc``: comments nest; return the index after the closing ``*/``."""
    depth, i = 0, start
    while True:
        opening, closing = sql.find("/*", i), sql.find("*/", i)
        if closing < 0:
            raise _near(sql, start, "unterminated /* comment")
        if 0 <= opening < closing:
            depth, i = depth + 1, opening + 2
        else:
            depth, i = depth - 1, closing + 2
            if depth == 0:
                return i


def _string(sql: str, start: int, quote: int, kind: str, space: str) -> tuple[int, str]:
    """Scan a quoted literal from its opening quote; return (end, value) (value only for '…' and E'…')."""
    parts: list[str] = []
    i = quote + 1
    while True:
        if kind == "e":
            i, part = _e_body(sql, start, i)
        else:
            end = i
            while True:
                end = sql.find("'", end)
                if end < 0:
                    raise _near(sql, start, _UNTERMINATED[kind])
                if sql[end + 1 : end + 2] != "'":
                    break
                end += 2
            part, i = sql[i:end].replace("''", "'"), end + 1
        parts.append(part)
        # scan.l quotecontinue: the literal goes on after whitespace holding a newline and a quote
        horizontal = "".join(ch for ch in _HORIZ if ch in space)
        m = re.compile(f"[{re.escape(horizontal)}]*[\\n\\r][{re.escape(space)}]*'").match(sql, i)
        if not m:
            return i, "".join(parts)
        i = m.end()


def _e_body(sql: str, start: int, i: int) -> tuple[int, str]:
    """scan.l ``xe``: backslash escapes of an ``E'…'`` literal, as PostgreSQL decodes them.

    Octal and ``\\x`` escapes give bytes; the result must be valid UTF-8 (``pg_verifymbstr``).
    """
    out = bytearray()
    n = len(sql)
    while True:
        if i >= n:
            raise _near(sql, start, "unterminated quoted string")
        c = sql[i]
        if c == "'":
            if sql[i + 1 : i + 2] == "'":
                out += b"'"
                i += 2
                continue
            break
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        if i + 1 >= n:
            raise _near(sql, start, "unterminated quoted string")
        e = sql[i + 1]
        if e in "uU":
            width = 4 if e == "u" else 8
            digits = sql[i + 2 : i + 2 + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise PublicationError("invalid Unicode escape", source=sql, position=i + 1,
                                       hint="Unicode escapes must be \\uXXXX or \\UXXXXXXXX.")
            code, esc_end = int(digits, 16), i + 2 + width
            if 0xD800 <= code <= 0xDBFF:  # a high surrogate must be followed by \u of a low one
                low = re.compile(r"\\u([0-9A-Fa-f]{4})").match(sql, esc_end)
                if low is None or not 0xDC00 <= (low_code := int(low.group(1), 16)) <= 0xDFFF:
                    raise PublicationSyntaxError(
                        f'invalid Unicode surrogate pair at or near "{sql[esc_end : esc_end + 1]}"', source=sql,
                        position=esc_end + 1, hint=_SURROGATE)
                code = 0x10000 + ((code - 0xD800) << 10) + (low_code - 0xDC00)
                esc_end = low.end()
            elif 0xDC00 <= code <= 0xDFFF:
                raise PublicationSyntaxError(
                    f'invalid Unicode surrogate pair at or near "{sql[i:esc_end]}"', source=sql, position=i + 1,
                    hint=_SURROGATE)
            elif code == 0 or code > 0x10FFFF:
                raise PublicationSyntaxError(
                    f'invalid Unicode escape value at or near "{sql[i:esc_end]}"', source=sql, position=i + 1,
                    hint="write a code point from U+0001 to U+10FFFF")
            out += chr(code).encode()
            i = esc_end
        elif m := re.compile(r"[0-7]{1,3}").match(sql, i + 1):
            out.append(int(m.group(0), 8) & 0xFF)
            i = m.end()
        elif e == "x" and (m := re.compile(r"[0-9A-Fa-f]{1,2}").match(sql, i + 2)):
            out.append(int(m.group(0), 16))
            i = m.end()
        else:
            out += {"b": b"\b", "f": b"\f", "n": b"\n", "r": b"\r", "t": b"\t"}.get(e, e.encode())
            i += 2
    try:
        if 0 in out:
            raise UnicodeDecodeError("utf-8", bytes(out), out.index(0), out.index(0) + 1, "NUL")
        return i + 1, out.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = bytes(out)[err.start : err.start + 1]
        raise PublicationError(f'invalid byte sequence for encoding "UTF8": 0x{bad.hex()}',
                               hint="write the character itself, or the \\u escape of its code point") from None


_SURROGATE = "write the character's code point as \\UXXXXXXXX, or a high surrogate \\uD800-\\uDBFF then a low one"
_SQLGLOT_SPACE = re.compile(r"\s")


def reconcile(sql: str, pg: list[PgToken], tokens: list[Token]) -> list[Token]:
    """sqlglot's ``tokens`` of ``sql``, corrected to PostgreSQL's reading ``pg`` (see the module doc)."""
    result: list[Token] = []
    j = 0  # both lists are in text order: one pass
    skip = 0  # pg tokens already taken (``UESCAPE 'c'`` after a ``U&"…"`` name)
    for index, tok in enumerate(pg):
        if skip:
            skip -= 1
            continue
        if tok.kind == "other":
            raise PublicationSyntaxError(
                f'syntax error at or near "{tok.value}"', source=sql, position=tok.start + 1,
                hint=f"remove the character U+{ord(tok.value or ' '):04X}: between words PostgreSQL takes only "
                "spaces, tabs, newlines, carriage returns and form feeds (and vertical tabs from PostgreSQL 16 on)")
        while j < len(tokens) and tokens[j].end < tok.start:
            result.append(tokens[j])
            j += 1
        end = tok.end
        if tok.kind == "qident" and sql[tok.start] in "uU" and _uescape(sql, pg, index) is not None:
            skip, end = 2, pg[index + 2].end  # the name's UESCAPE 'c' is part of it (parser.c base_yylex)
        k = j
        while k < len(tokens) and tokens[k].start < end:
            k += 1
        covered = tokens[j:k]
        if tok.kind == "ident" and _SQLGLOT_SPACE.search(tok.value or ""):
            kind, value = TokenType.VAR, tok.value or ""  # sqlglot split the name at a Unicode space
        elif tok.kind in ("string", "dollar") and tok.value is not None and covered:
            kind, value = covered[0].token_type, tok.value  # PostgreSQL's value, continued strings joined
        elif tok.kind == "qident" and sql[tok.start] in "uU" and covered:
            kind, value = TokenType.IDENTIFIER, _unicode_identifier(sql, tok, _uescape(sql, pg, index))
        elif tok.kind == "number" and (tok.value or "")[:2].lower() in ("0x", "0o", "0b"):
            kind, value = TokenType.NUMBER, str(int(tok.value or "", 0))  # sqlglot: a hex or bit string
        elif tok.kind == "number" and "_" in (tok.value or ""):
            kind, value = TokenType.NUMBER, (tok.value or "").replace("_", "")  # 1_000: sqlglot splits it
        else:
            if tok.kind in ("string", "dollar", "qident", "number") and not (
                    len(covered) == 1 and covered[0].start == tok.start and covered[0].end == tok.end - 1):
                raise PublicationSyntaxError(
                    f'cannot read "{sql[tok.start : tok.end]}" as PostgreSQL does', source=sql,
                    position=tok.start + 1, hint="write the literal in a plainer form (e.g. a '…' string or a "
                    "decimal number)")
            continue
        first = covered[0] if covered else None
        result.append(Token(kind, value, first.line if first else 1, first.col if first else 1, tok.start,
                            end - 1, [c for t in covered for c in t.comments]))
        j = k
    result.extend(tokens[j:])
    return result


def _uescape(sql: str, pg: list[PgToken], index: int) -> str | None:
    """The escape character a ``UESCAPE 'c'`` after the ``U&"…"`` name ``pg[index]`` gives, or None without one.

    parser.c ``base_yylex``: the token after UESCAPE must be an SCONST (a ``'…'``, ``E'…'`` or dollar-quoted
    string: ``UESCAPE must be followed by a simple string literal``), holding one byte that
    ``check_uescapechar`` accepts (``invalid Unicode escape character``); both errors name that token."""
    following = pg[index + 1 : index + 3]
    if not following or following[0].kind != "ident" or (following[0].value or "").lower() != "uescape":
        return None
    if len(following) < 2 or not (following[1].kind == "dollar" or (
            following[1].kind == "string" and sql[following[1].start] in "'eE")):
        # the next token: an operator or punctuation (which scan() does not keep) when one comes first
        gap = re.compile(r"[\s]*").match(sql, following[0].end)
        at = gap.end() if gap else following[0].end
        if at >= len(sql):
            near = "at end of input"
        elif len(following) > 1 and following[1].start == at:
            near = f'at or near "{sql[at : following[1].end]}"'
        else:
            near = f'at or near "{sql[at]}"'
        raise PublicationSyntaxError(f"UESCAPE must be followed by a simple string literal {near}", source=sql,
                                     position=at + 1,
                                     hint="write the escape character as a quoted string, e.g. UESCAPE '!'")
    escape = following[1].value or ""
    if len(escape.encode()) != 1 or escape in _HEX_DIGITS or escape in "+'\" \t\n\r\f\v":
        raise PublicationSyntaxError(
            f'invalid Unicode escape character at or near "{sql[following[1].start : following[1].end]}"',
            source=sql, position=following[1].start + 1,
            hint="choose one ASCII character that is not a hexadecimal digit, +, a quote or a space")
    return escape


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _unicode_identifier(sql: str, tok: PgToken, escape: str | None) -> str:
    """The name ``U&"…"`` [``UESCAPE 'c'``] spells, decoded as parser.c ``str_udeescape`` decodes it (the escapes
    of ``U&'…'``, core/filters/constants.py ``unicode_escapes``) with the escape character ``escape`` (``\\``
    without UESCAPE)."""
    from airflow_provider_rowfilter.core.filters.constants import InvalidConstant, unicode_escapes

    try:
        return unicode_escapes(sql[tok.start + 3 : tok.end - 1].replace('""', '"'), escape or "\\")
    except InvalidConstant as e:
        raise PublicationError(str(e.args[0]), source=sql, position=tok.start + 1,
                               hint=e.args[1] if len(e.args) > 1 else None) from None
