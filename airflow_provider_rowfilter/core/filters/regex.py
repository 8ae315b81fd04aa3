"""Row filters, regular expressions: the part of PostgreSQL's that Java's regex matches exactly.

PostgreSQL's ``~``, ``~*``, ``!~`` and ``!~*`` read the pattern as an advanced regular expression
(src/backend/regex/regcomp.c, Henry Spencer's engine); Spark's ``RLIKE`` hands it to
``java.util.regex.Pattern`` and asks ``find()``. The two dialects share a core and disagree
elsewhere (``\\b`` is a backspace in one and a word boundary in the other, ``$`` also matches
before a final newline in Java, POSIX classes, back references, lookarounds, embedded options …).
:func:`java_regex` accepts only a checked subset and writes it in Java's syntax with PostgreSQL's
meaning; anything else raises :class:`UnsupportedRegex` with the reason, which the analysis turns
into a refusal with a fix. ``SIMILAR TO`` is first rewritten into a regular expression exactly as
PostgreSQL does (:func:`similar_to_regex`, regexp.c ``similar_escape_internal``).

The subset: plain characters, ``.``, anchors ``^`` and ``$``, bracket expressions of plain
characters and ASCII ranges (``[a-z0-9_]``, ``[^,]``), ``* + ?`` and bounds ``{n}``, ``{n,}``,
``{n,m}`` (greedy or not: whether a match exists does not depend on it), alternation, groups
``(…)`` and ``(?:…)``, escapes of punctuation (``\\.``), ``\\n \\t \\r \\f \\v \\a \\e``, and the
class escapes ``\\d \\s \\w`` (and negations) where the collation is ASCII-only (``C``/``POSIX``).
"""

from __future__ import annotations

# regcomp.c DUPMAX: larger repetition counts are "invalid repetition count(s)".
DUPMAX = 255
_ESCAPED_CHARS = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "e": "\x1b"}
_CLASS_ESCAPES = set("dDsSwW")
# PostgreSQL's bracket classes (regc_locale.c) as Java's ASCII POSIX classes: the same members under C.
_POSIX_CLASSES = {name: f"\\p{{{java}}}" for name, java in (
    ("alpha", "Alpha"), ("digit", "Digit"), ("alnum", "Alnum"), ("upper", "Upper"), ("lower", "Lower"),
    ("space", "Space"), ("punct", "Punct"), ("print", "Print"), ("graph", "Graph"), ("cntrl", "Cntrl"),
    ("xdigit", "XDigit"), ("blank", "Blank"), ("ascii", "ASCII"))} | {"word": "\\p{Alnum}_"}


class UnsupportedRegex(Exception):
    """The pattern is outside the subset Java matches with PostgreSQL's meaning (or is invalid)."""

    def __init__(self, reason: str, *, invalid: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.invalid = invalid  # PostgreSQL itself raises "invalid regular expression" for it


def _lit(ch: str) -> str:
    """One character as a Java regex literal: letters and digits as they are, ASCII others as \\x{…}."""
    if ch.isascii() and ch.isalnum():
        return ch
    if ch.isascii():
        return f"\\x{{{ord(ch):x}}}"
    return ch  # a non-ASCII character stands for itself in Java's syntax


class _Reader:
    def __init__(self, pattern: str, *, icase: bool, ascii_classes: bool) -> None:
        self.p = pattern
        self.i = 0
        self.icase = icase
        self.ascii_classes = ascii_classes

    def peek(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.p[j] if j < len(self.p) else None

    def regex(self, depth: int) -> str:
        branches = [self.branch()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.branch())
        if depth == 0 and self.peek() == ")":
            raise UnsupportedRegex("parentheses () not balanced", invalid=True)
        return "|".join(branches)

    def branch(self) -> str:
        out = []
        while (c := self.peek()) is not None and c not in "|)":
            atom, quantifiable = self.atom()
            quantifier = self.quantifier()
            if quantifier and not quantifiable:
                raise UnsupportedRegex("quantifier operand invalid", invalid=True)
            out.append(atom + quantifier)
        return "".join(out)

    def atom(self) -> tuple[str, bool]:
        ch = self.p[self.i]
        self.i += 1
        if ch == "(":
            if self.peek() == "?":
                if self.peek(1) != ":":
                    raise UnsupportedRegex("lookaround constraints and embedded options ((?=, (?!, (?i) …)")
                self.i += 2
            inner = self.regex(depth=1)
            if self.peek() != ")":
                raise UnsupportedRegex("parentheses () not balanced", invalid=True)
            self.i += 1
            return f"(?:{inner})", True
        if ch == ".":
            return ".", True
        if ch == "^":
            return "^", False
        if ch == "$":
            return "\\z", False  # Java's $ also matches before a final line terminator
        if ch == "[":
            return self.bracket(), True
        if ch == "\\" and self.peek() in ("A", "Z"):
            # constraint escapes (regc_lex.c): \A only at the beginning of the string, \Z only at its end (Java's
            # \Z also matches before a final line terminator, its \z does not)
            self.i += 1
            if self.peek() in ("*", "+", "?", "{"):
                raise UnsupportedRegex(f"a quantifier after \\{self.p[self.i - 1]}")
            return ("\\A" if self.p[self.i - 1] == "A" else "\\z"), False
        if ch == "\\":
            return self.escape(), True
        if ch in "*+?":
            raise UnsupportedRegex("quantifier operand invalid", invalid=True)
        if ch == "{":
            if (self.peek() or "").isdigit():
                raise UnsupportedRegex("quantifier operand invalid", invalid=True)
            return _lit(ch), True  # ARE: a { not followed by a digit is an ordinary character
        return _lit(ch), True

    def quantifier(self) -> str:
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.i += 1
            q = ch
        elif ch == "{" and (self.peek(1) or "").isdigit():
            end = self.p.find("}", self.i)
            body = self.p[self.i + 1 : end] if end > 0 else ""
            parts = body.split(",")
            if end < 0:
                raise UnsupportedRegex("braces {} not balanced", invalid=True)
            if len(parts) > 2 or not parts[0].isdigit() or (len(parts) == 2 and parts[1] and not parts[1].isdigit()):
                raise UnsupportedRegex(f"the bound {{{body}}}")
            low = int(parts[0])
            high = int(parts[1]) if len(parts) == 2 and parts[1] else None
            if low > DUPMAX or (high is not None and (high > DUPMAX or high < low)):
                raise UnsupportedRegex("invalid repetition count(s)", invalid=True)
            self.i = end + 1
            q = "{" + body + "}"
        else:
            return ""
        if self.peek() == "?":  # non-greedy: the same strings match
            self.i += 1
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and (self.peek(1) or "").isdigit()):
            raise UnsupportedRegex("quantifier operand invalid", invalid=True)
        return q

    def escape(self) -> str:
        ch = self.peek()
        if ch is None:
            raise UnsupportedRegex("invalid escape \\ sequence", invalid=True)
        self.i += 1
        if not ch.isalnum():
            return _lit(ch)
        if ch in _ESCAPED_CHARS:
            return _lit(_ESCAPED_CHARS[ch])
        if ch in "uUx":
            return self.code_point(ch)
        if ch in _CLASS_ESCAPES:
            if not self.ascii_classes:
                raise UnsupportedRegex(f"the class escape \\{ch} outside the C collation (its letters and "
                                       "spaces are the collation's)")
            if self.icase and ch.isupper():
                raise UnsupportedRegex(f"the negated class escape \\{ch} in a case-insensitive match")
            return "\\" + ch
        raise UnsupportedRegex(f"the escape \\{ch} (PostgreSQL's meaning differs from Java's or has no "
                               "counterpart: back references, \\m \\M \\y \\Y \\b \\B \\c \\0 …)")

    def code_point(self, ch: str) -> str:
        """``\\uwxyz`` (exactly four hexadecimal digits), ``\\Ustuvwxyz`` (exactly eight), ``\\xhhh`` (a run of them):
        the character of that code point (regc_lex.c ``lexescape``), a literal for Java. Translated only for a whole
        run of at most eight digits naming a character (U+0001 to U+10FFFF, no surrogate)."""
        width = {"u": 4, "U": 8}.get(ch)
        run = len(self.p[self.i:]) - len(self.p[self.i:].lstrip("0123456789abcdefABCDEF"))
        digits = self.p[self.i : self.i + (width or run)]
        if (width is not None and len(digits) < width) or not digits or len(digits) > 8:
            raise UnsupportedRegex(f"the escape \\{ch} without {'exactly ' + str(width) if width else 'one to eight'} "
                                   "hexadecimal digits")
        value = int(digits, 16)
        if not 0 < value <= 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            raise UnsupportedRegex(f"the escape \\{ch}{digits}, no character")
        self.i += len(digits)
        return _lit(chr(value))

    def bracket(self) -> str:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
            if self.icase:
                raise UnsupportedRegex("a negated bracket expression in a case-insensitive match")
        if self.peek() == "]":
            raise UnsupportedRegex("a bracket expression starting with ]")
        items: list[str] = []
        first = True
        while True:
            ch = self.peek()
            if ch is None:
                raise UnsupportedRegex("brackets [] not balanced", invalid=True)
            self.i += 1
            if ch == "]":
                break
            if ch == "[" and self.peek() == ":":
                items.append(self.posix_class())
                first = False
                continue
            if ch == "[" and self.peek() in (".", "="):
                raise UnsupportedRegex("collating elements and equivalence classes in brackets ([.x.], [=x=])")
            if ch == "\\":
                nxt = self.peek()
                if nxt is None or nxt.isalnum():
                    raise UnsupportedRegex(f"the escape \\{nxt or ''} inside brackets")
                self.i += 1
                ch = nxt
            if ch == "-" and not first and self.peek() != "]":
                raise UnsupportedRegex("a - inside brackets that is not a range between two characters")
            if self.peek() == "-" and self.peek(1) not in (None, "]"):
                high = self.p[self.i + 1]
                self.i += 2
                items.append(self.range(ch, high))
            else:
                items.append(_lit(ch))
            first = False
        return ("[^" if negated else "[") + "".join(items) + "]"

    def posix_class(self) -> str:
        """``[:name:]`` inside brackets (self.i at the ``:``). Under the C collation PostgreSQL's classes hold ASCII
        characters only (regc_pg_locale.c, the C strategy: ``c <= 127`` and the C library's class), as Java's
        ``\\p{…}`` POSIX classes do without UNICODE_CHARACTER_CLASS; ``word`` is ``alnum`` and ``_``."""
        end = self.p.find(":]", self.i + 1)
        name = self.p[self.i + 1:end] if end != -1 else ""
        if name not in _POSIX_CLASSES:
            raise UnsupportedRegex(f"the bracket item [:{name or '…'}: (not a character class Java shares)")
        if not self.ascii_classes:
            raise UnsupportedRegex(f"the class [:{name}:] outside the C collation (its members are the collation's)")
        if self.icase:
            raise UnsupportedRegex(f"the class [:{name}:] in a case-insensitive match")
        self.i = end + 2
        return _POSIX_CLASSES[name]

    def range(self, low: str, high: str) -> str:
        if not (low.isascii() and high.isascii() and low.isalnum() and high.isalnum()):
            raise UnsupportedRegex(f"the range {low}-{high} (only ranges of ASCII letters or digits are exact)")
        if not self.ascii_classes:
            raise UnsupportedRegex(f"the range {low}-{high} outside the C collation")
        same_kind = (low.isdigit() and high.isdigit()) or (low.islower() and high.islower()) or (
            low.isupper() and high.isupper())
        if not same_kind:
            raise UnsupportedRegex(f"the range {low}-{high} (a range within digits, lower- or upper-case letters)")
        if low > high:
            raise UnsupportedRegex("invalid character range", invalid=True)
        return f"{low}-{high}"


def java_regex(pattern: str, *, icase: bool, ascii_classes: bool) -> str:
    """The Java pattern that ``find()``s exactly where PostgreSQL's ``~`` (``~*`` if ``icase``) matches.

    ``ascii_classes``: the collation is C/POSIX, where PostgreSQL's classes and case mapping are
    ASCII's (regc_pg_locale.c, the C strategy), as are Java's by default.
    """
    if pattern.startswith("***"):
        raise UnsupportedRegex("a director (***: or ***=)")
    reader = _Reader(pattern, icase=icase, ascii_classes=ascii_classes)
    body = reader.regex(depth=0)
    if icase and not ascii_classes:
        raise UnsupportedRegex("a case-insensitive match outside the C collation")
    # (?s): PostgreSQL's . and [^…] match a newline (no newline-sensitive flag); (?i): ASCII only in Java
    return ("(?is)" if icase else "(?s)") + body


def similar_to_regex(pattern: str, escape: str | None = "\\") -> str:
    """The regular expression PostgreSQL makes of a ``SIMILAR TO`` pattern (regexp.c similar_escape_internal)."""
    out = ["^(?:"]
    after_escape = in_class = False
    class_pos = 0
    for ch in pattern:
        if after_escape:
            if ch == '"' and not in_class:
                raise UnsupportedRegex('the escape-double-quote separator (meant for substring … SIMILAR)')
            out.append("\\" + ch)
            class_pos = 3
            after_escape = False
        elif escape and ch == escape:
            after_escape = True
        elif in_class:
            out.append("\\\\" if ch == "\\" else ch)
            if ch == "]" and class_pos > 2:
                in_class = False
            elif ch == "^" and class_pos == 1:
                class_pos = 2
            else:
                class_pos = 3
        elif ch == "[":
            out.append(ch)
            in_class, class_pos = True, 1
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        elif ch == "(":
            out.append("(?:")
        elif ch in "\\.^$":
            out.append("\\" + ch)
        else:
            out.append(ch)
    out.append(")$")
    return "".join(out)
