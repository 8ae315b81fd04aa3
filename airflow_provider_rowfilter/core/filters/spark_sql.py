"""Spark SQL building blocks of the row-filter translation, each with PostgreSQL's meaning.

Casts to the Spark counterpart of a PostgreSQL type, ``raise_error`` for the errors PostgreSQL raises
while evaluating a filter, float arithmetic and float8 → real with float.h's overflow and underflow
checks, ``date ± integer`` with date.c's range check, LIKE patterns rewritten for Spark's escape rules,
ASCII case mapping (the C collation's), and the typed read of a value's PostgreSQL text form (arrays
included, as array_out writes them; numeric's NaN and infinities as core/filters/spark_numeric.py holds them).
core/filters/spark_translation.py composes them.
"""

from __future__ import annotations

import re

from sqlglot import exp

from airflow_provider_rowfilter.core.errors import UntranslatableFilterError
from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.pg_types import PgType

# PostgreSQL's lower()/upper()/ILIKE under the C collation map ASCII letters only.
UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
LOWER = UPPER.lower()


def dtype(t: PgType) -> exp.DataType:
    spark = T.spark_type(t)
    if spark is None:
        raise UntranslatableFilterError(f"type {t} has no exact Spark counterpart")
    return exp.DataType.build(spark, dialect="spark")


def cast(node: exp.Expr, t: PgType) -> exp.Expr:
    return exp.Cast(this=node, to=dtype(t))


def fn(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


# The element of an array column, in exists()/forall(): a name no column of a filter's reads can take (they are
# the table's own names, or the apply's element_at(_nv, n)).
LAMBDA_ELEMENT = exp.Var(this="__rowfilter_element")
# The compared value x of ``x op ANY/ALL (array_column)``, bound once outside the elements' lambda.
LAMBDA_SCALAR = exp.Var(this="__rowfilter_scalar")
# A value whose nullness is tested, bound by evaluated_is_null's lambda.
LAMBDA_TESTED = exp.Var(this="__rowfilter_tested")

# The elements of PostgreSQL's text form of an array (arrayfuncs.c array_out): a quoted element (backslash before
# " and \) or an unquoted one; braces of every dimension and the bounds decoration ([0:1]={…}) are no element.
_ARRAY_ELEMENT = r'"(?:[^"\\]|\\.)*"|[^,{}"]+'


#: ``numeric_reads`` of a table a refresh records (core/publication/subscription_filters.py ``filters_document``): its
#: Spark filters read a numeric column as the struct :func:`typed_read` gives (NaN and ±Infinity kept); a document
#: without it was recorded before, its filters reading a bare DECIMAL (:func:`decimal_read`, core/apply/plan.py).
NUMERIC_READS = "struct"


def typed_read(text: exp.Expr, t: PgType) -> exp.Expr:
    """A value's PostgreSQL text form (``text``, a STRING expression) read as ``t``'s Spark type: a cast (numeric's
    struct: :func:`numeric_read`), or for an array its elements, each unquoted (an unquoted ``NULL`` is NULL:
    array_out quotes any element spelled so) and read so, all dimensions in order, as ``op ANY/ALL`` walks them."""
    return _read(text, t, _scalar_read)


def decimal_read(text: exp.Expr, t: PgType, column: str) -> exp.Expr:
    """:func:`typed_read` with numeric read as a bare DECIMAL: what the filters a refresh recorded before numeric's
    special values were carried expect (core/apply/plan.py). Such a filter cannot judge NaN or an infinity: the read
    raises, naming the column and the fix, where Spark's cast raised CAST_INVALID_INPUT."""
    def scalar(e: exp.Expr, s: PgType) -> exp.Expr:
        if s.name != "numeric":
            return _scalar_read(e, s)
        special = exp.In(this=e.copy(), expressions=[exp.Literal.string(x) for x in NUMERIC_SPECIALS])
        message = fn("concat", exp.Literal.string(f'the filter column "{column}" holds '), e.copy(),
                     exp.Literal.string(", which the filters recorded by an earlier version of airflow-provider-rowfilter "
                                        "read as a decimal and cannot judge: run `rowfilter refresh` (it records them "
                                        "again, NaN and the infinities carried), then apply again"))
        return exp.Case(ifs=[exp.If(this=special, true=fn("raise_error", message))],
                        default=exp.Cast(this=e, to=exp.DataType.build(T.spark_decimal(s), dialect="spark")))
    return _read(text, t, scalar)


def _read(text: exp.Expr, t: PgType, scalar) -> exp.Expr:
    if t.element is None:
        return scalar(text, t)
    element = exp.Var(this="__rowfilter_text")
    unquoted = exp.Case(
        ifs=[exp.If(this=fn("startswith", element.copy(), exp.Literal.string('"')),
                    true=fn("regexp_replace", fn("substring", element.copy(), exp.Literal.number(2),
                                                   exp.Sub(this=fn("length", element.copy()),
                                                           expression=exp.Literal.number(2))),
                             exp.Literal.string(r"\\(.)"), exp.Literal.string("$1"))),
             exp.If(this=exp.EQ(this=element.copy(), expression=exp.Literal.string("NULL")), true=exp.Null())],
        default=element.copy())
    undecorated = fn("regexp_replace", text, exp.Literal.string(r"^\[[^=]*\]="), exp.Literal.string(""))
    elements = fn("regexp_extract_all", undecorated, exp.Literal.string(_ARRAY_ELEMENT), exp.Literal.number(0))
    return fn("transform", elements, exp.Lambda(this=scalar(unquoted, t.element), expressions=[element.copy()]))


def _scalar_read(text: exp.Expr, t: PgType) -> exp.Expr:
    return numeric_read(text, t) if t.name == "numeric" else cast(text, t)


#: numeric_out's text of numeric's special values (numeric.c), each the k of its Spark struct (core/filters/spark_numeric.py)
NUMERIC_SPECIALS = ("NaN", "Infinity", "-Infinity")


def double(text: str) -> exp.Expr:
    """A DOUBLE constant: a number, ``NaN``, ``Infinity`` or ``-Infinity``."""
    literal = exp.Literal.string(text) if text in NUMERIC_SPECIALS else exp.Literal.number(text)
    return exp.Cast(this=literal, to=exp.DataType.build("DOUBLE"))


def numeric_read(text: exp.Expr, t: PgType) -> exp.Expr:
    """numeric_out's text read as numeric(p,s)'s struct (core/filters/spark_numeric.py): ``k`` 0 and ``v`` the DECIMAL
    for a number, ``k`` NaN or ±Infinity and ``v`` NULL for ``NaN``, ``Infinity``, ``-Infinity``; NULL for NULL."""
    specials = [exp.Literal.string(x) for x in NUMERIC_SPECIALS]
    k = exp.Case(this=text.copy(), ifs=[exp.If(this=x.copy(), true=double(x.this)) for x in specials],
                 default=double("0"))
    struct = fn("named_struct", exp.Literal.string("k"), k, exp.Literal.string("v"),
                numeric_channel_read(text.copy(), t, "v"))
    return exp.Case(ifs=[exp.If(this=exp.Is(this=text, expression=exp.Null()), true=cast(exp.Null(), t))],
                    default=struct)


def numeric_channel_read(text: exp.Expr, t: PgType, channel: str) -> exp.Expr:
    """One field of :func:`numeric_read`'s struct, read from the text alone: ``k`` (NULL for NULL) or ``v``."""
    specials = [exp.Literal.string(x) for x in NUMERIC_SPECIALS]
    if channel == "k":
        return exp.Case(ifs=[exp.If(this=exp.Is(this=text.copy(), expression=exp.Null()), true=exp.Null()),
                             *(exp.If(this=exp.EQ(this=text.copy(), expression=x.copy()), true=double(x.this))
                               for x in specials)],
                        default=double("0"))
    finite = exp.Case(ifs=[exp.If(this=exp.In(this=text.copy(), expressions=specials), true=exp.Null())],
                      default=text.copy())
    return exp.Cast(this=finite, to=exp.DataType.build(T.spark_decimal(t), dialect="spark"))


_ATOMS = (exp.Column, exp.Literal, exp.Paren, exp.Cast, exp.Func, exp.Boolean, exp.Null, exp.Case, exp.Dot)


def operand(e: exp.Expr) -> exp.Expr:
    """Parenthesise a compound operand: ``b = (x <> y)`` must not come out as ``b = x <> y``. AND and OR are
    sqlglot functions too (exp.Connector), but no atoms: ``ROW(b AND c) IS NULL`` is ``(b AND c) IS NULL``."""
    return e if isinstance(e, _ATOMS) and not isinstance(e, exp.Connector) else exp.Paren(this=e)


def ascii_lower(e: exp.Expr) -> exp.Expr:
    """PostgreSQL's lower() under the C collation: ASCII letters only."""
    return fn("translate", e, exp.Literal.string(UPPER), exp.Literal.string(LOWER))


def evaluated_is_null(value: exp.Expr) -> exp.Expr:
    """``value IS NULL``, with ``value`` computed. Spark's optimizer (NullPropagation) decides ``IS [NOT] NULL``
    of an expression it proves never NULL without computing it, where PostgreSQL computes it and raises its
    error (``COALESCE(-2::bigint % i2, 1.5) IS NULL`` with ``i2 = 0``: ``division by zero``). Tested in a lambda
    over a one-element array, the value is computed to build the array, and the test stays."""
    test = exp.Is(this=LAMBDA_TESTED.copy(), expression=exp.Null())
    return fn("exists", exp.Array(expressions=[value]), exp.Lambda(this=test, expressions=[LAMBDA_TESTED.copy()]))


def raise_error(message: str) -> exp.Expr:
    return fn("raise_error", exp.Literal.string(message))


def checked_float(cls, left: exp.Expr, right: exp.Expr, result: exp.Expr,
                   t: PgType) -> exp.Expr:
    """PostgreSQL's float arithmetic with its errors (float.h); Spark yields Infinity or 0 instead.

    ``float8_pl``/``_mi``/``_mul``/``_div`` raise "value out of range: overflow" when the result
    is infinite but no input was, ``_mul``/``_div`` raise "underflow" when the result is 0 but the
    inputs were not (nor, for division, an infinite divisor), and ``_div`` raises "division by
    zero" for a zero divisor unless the dividend is NaN (NaN / 0 is NaN). Spark's ANSI division
    raises for every zero divisor, so NaN / 0 is answered before dividing.
    """
    infinity = cast(exp.Literal.string("Infinity"), t)
    zero = cast(exp.Literal.number(0), t)

    def is_inf(e: exp.Expr) -> exp.Expr:
        return exp.EQ(this=fn("abs", e.copy()), expression=infinity.copy())

    def is_zero(e: exp.Expr) -> exp.Expr:
        return exp.EQ(this=e.copy(), expression=zero.copy())

    def all_of(*conds: exp.Expr) -> exp.Expr:
        return exp.and_(*(exp.Paren(this=c) for c in conds))

    def no(cond: exp.Expr) -> exp.Expr:
        return exp.Not(this=exp.Paren(this=cond))

    underflow: exp.Expr | None
    if cls is exp.Div:
        overflow = all_of(is_inf(result), no(is_inf(left)))
        underflow = all_of(is_zero(result), no(is_zero(left)), no(is_inf(right)))
    else:
        overflow = all_of(is_inf(result), no(is_inf(left)), no(is_inf(right)))
        underflow = (all_of(is_zero(result), no(is_zero(left)), no(is_zero(right)))
                     if cls is exp.Mul else None)
    ifs = [exp.If(this=overflow, true=raise_error("value out of range: overflow"))]
    if underflow is not None:
        ifs.append(exp.If(this=underflow, true=raise_error("value out of range: underflow")))
    checked: exp.Expr = exp.Case(ifs=ifs, default=result)
    if cls is exp.Div:
        nan_by_zero = all_of(is_zero(right), fn("isnan", left.copy()))
        checked = exp.Case(ifs=[exp.If(this=nan_by_zero, true=left.copy())], default=checked)
    return checked


def checked_float4(value: exp.Expr, result: exp.Expr) -> exp.Expr:
    """float8 → real raises "value out of range: overflow/underflow" in PostgreSQL (float84)."""
    infinity = cast(exp.Literal.string("Infinity"), PgType("float8"))

    def is_inf(e: exp.Expr) -> exp.Expr:
        return exp.EQ(this=fn("abs", cast(e.copy(), PgType("float8"))), expression=infinity.copy())

    def is_zero(e: exp.Expr) -> exp.Expr:
        return exp.EQ(this=e.copy(), expression=exp.Literal.number(0))

    overflow = exp.and_(exp.Paren(this=is_inf(result)), exp.Not(this=exp.Paren(this=is_inf(value))))
    underflow = exp.and_(exp.Paren(this=is_zero(result)), exp.Not(this=exp.Paren(this=is_zero(value))))
    return exp.Case(ifs=[exp.If(this=overflow, true=raise_error("value out of range: overflow")),
                         exp.If(this=underflow, true=raise_error("value out of range: underflow"))],
                    default=result)


# PostgreSQL's dates run from 4714-11-24 BC to 5874897-12-31 (IS_VALID_DATE), as days since 1970-01-01.
MIN_UNIX_DATE, MAX_UNIX_DATE = -2440588, 2145042905


def checked_date(cls, date: exp.Expr, days: exp.Expr) -> exp.Expr:
    """date ± integer raises "date out of range" in PostgreSQL (date_pli, date_mii); Spark's date_add does
    not, and its int arithmetic wraps. The range is checked on the exact sum, in bigint."""
    exact = cls(this=fn("unix_date", date.copy()), expression=exp.Cast(this=days.copy(), to=exp.DataType.build("bigint")))
    outside = exp.Not(this=exp.Paren(this=exp.Between(this=exact, low=exp.Literal.number(MIN_UNIX_DATE),
                                                      high=exp.Literal.number(MAX_UNIX_DATE))))
    result = fn("date_add" if cls is exp.Add else "date_sub", date, days)
    return exp.Case(ifs=[exp.If(this=outside, true=raise_error("date out of range"))], default=result)


_LIKE_SPECIAL = re.compile(r"[%_\\]")


def like_escapes(pattern: exp.Expr) -> exp.Expr:
    """A LIKE pattern computed per row, with PostgreSQL's backslash escapes made Spark's: PostgreSQL takes
    any character after a backslash for itself, Spark only ``%``, ``_`` and a backslash (it raises at any
    other). Left to right, an escape with one of those stays, any other loses its backslash; a trailing
    backslash stays, and both raise there (PostgreSQL where the match reaches it)."""
    return fn("regexp_replace", pattern, exp.Literal.string(r"(?s)(\\[\\%_])|\\(.)"), exp.Literal.string("$1$2"))


# A LIKE pattern ending in a backslash that escapes nothing (what is left of it after every ``\\x`` pair)
_LONE_TRAILING_ESCAPE = r"(?s)^(?:[^\\]|\\.)*\\$"


def like_per_row(subject: exp.Expr, pattern: exp.Expr, negate: bool, fold: bool) -> exp.Expr:
    """``subject [NOT] LIKE|ILIKE pattern`` for a pattern computed per row (``fold``: ILIKE's ASCII case mapping).

    A pattern ending in a lone backslash is PostgreSQL's error "LIKE pattern must not end with escape character"
    only when MatchText (like_match.c) reaches that backslash; otherwise the match fails first (false; NOT LIKE:
    true). With P the pattern before the backslash, MatchText reaches it in its main loop, which runs while text
    remains, so when P matches a prefix of the subject with at least one character left (``subject LIKE P || '_%'``);
    or, when P ends in a run of wildcards from a ``%`` on (``Q%__``), in its ``%`` branch, once Q matched with text
    left and the run's ``_`` found their characters (``subject LIKE Q || '_…' || '%'``). Spark raises for such a
    pattern whatever the subject, so that case is answered before its LIKE."""
    escaped = like_escapes(pattern)
    if fold:
        subject, escaped = ascii_lower(subject), ascii_lower(escaped)
    like = exp.Like(this=subject, expression=escaped)
    before = fn("substring", escaped.copy(), exp.Literal.number(1),
                exp.Sub(this=fn("char_length", escaped.copy()), expression=exp.Literal.number(1)))
    run = exp.Literal.string(_TRAILING_WILDCARDS)
    head = fn("regexp_extract", before.copy(), run.copy(), exp.Literal.number(1))
    wildcards = fn("regexp_extract", before.copy(), run.copy(), exp.Literal.number(2))
    underscores = exp.Sub(this=fn("char_length", wildcards),
                          expression=fn("char_length", fn("replace", wildcards.copy(), exp.Literal.string("_"))))
    reached = exp.Case(
        ifs=[exp.If(this=exp.RegexpLike(this=before.copy(), expression=run.copy()),
                    true=fn("concat", head, fn("repeat", exp.Literal.string("_"),
                                               exp.Greatest(this=underscores, expressions=[exp.Literal.number(1)])),
                            exp.Literal.string("%")))],
        default=fn("concat", before, exp.Literal.string("_%")))
    reaches = exp.Like(this=subject.copy(), expression=reached)
    lone = exp.RegexpLike(this=pattern.copy(), expression=exp.Literal.string(_LONE_TRAILING_ESCAPE))
    answered = exp.Case(ifs=[exp.If(this=lone, true=exp.Case(
        ifs=[exp.If(this=reaches, true=raise_error("LIKE pattern must not end with escape character"))],
        default=reaches.copy()))], default=like)
    return exp.Not(this=exp.Paren(this=answered)) if negate else answered


# In a pattern in Spark's LIKE form: what precedes a final run of wildcards that starts with an unescaped %, and
# that run (the tokens before it are single characters or escape pairs, so its % is no escaped one).
_TRAILING_WILDCARDS = r"(?s)^((?:[^\\]|\\.)*?)(%[%_]*)$"


def like_pattern(pattern: str, escape: str | None) -> str:
    """Rewrite a PostgreSQL LIKE pattern for Spark's LIKE (whose escape character is backslash).

    PostgreSQL lets the escape character precede any character (it then stands for itself);
    Spark only accepts it before ``%``, ``_`` and itself.
    """
    escape = "\\" if escape is None else escape
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape and ch == escape:
            if i + 1 == len(pattern):
                raise UntranslatableFilterError("LIKE pattern must not end with escape character")
            nxt = pattern[i + 1]
            out.append("\\" + nxt if _LIKE_SPECIAL.match(nxt) else nxt)
            i += 2
            continue
        out.append("\\\\" if ch == "\\" else ch)
        i += 1
    return "".join(out)
