"""Row filters, semantics of the string functions, regular expressions, ANY/ALL and row tests.

A mixin of core/filters/analysis.py's analyzer (same attributes: ``types``, ``targets``,
``constants``, ``collations``, ``context``): it types ``substr``/``substring``, ``left``, ``right``,
``strpos``/``position``, ``split_part``, ``repeat``, the pattern operators ``~ ~* !~ !~*`` and
``SIMILAR TO``, ``x op ANY/ALL (ARRAY[…])`` and ``ROW(…) IS [NOT] NULL`` as PostgreSQL's parse
analysis does (parse_func.c, parse_oper.c ``make_scalar_array_op``, parse_expr.c
``transformArrayExpr``), and decides which regular expressions Spark can evaluate exactly
(core/filters/regex.py). core/filters/spark_translation.py renders them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.grammar import ONLY_SIMPLE, quantified_array
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.regex import UnsupportedRegex, java_regex, similar_to_regex

if TYPE_CHECKING:  # the analyzer this mixin is part of (core/filters/analysis.py ``_Analyzer``)
    _Analyzer = Any
else:
    _Analyzer = object

# Collations whose regex classes and case mapping are ASCII's (regc_pg_locale.c, the C strategy).
ASCII_CTYPE_COLLATIONS = frozenset({"C", "POSIX", "ucs_basic"})
# Where PostgreSQL evaluates any filter itself: what a refusal of a regular expression suggests.
SOURCE_SIDE_FIX = ("publish from the catalog of a PostgreSQL 15+ publisher (PostgreSQL then evaluates the filter "
                   "itself), or rewrite the condition with LIKE, starts_with() or the constructs in "
                   "docs/row-filters.md")

# name -> argument kinds (t: text, i: integer), for each arity PostgreSQL ships (pg_proc)
STRING_FUNCTIONS = {
    "substring": ("ti", "tii"), "left": ("ti",), "right": ("ti",), "position": ("tt",),
    "split_part": ("tti",), "repeat": ("ti",),
}


def row_fields(node: exp.Expr) -> list[exp.Expr] | None:
    """The fields of ``ROW(…)`` or ``(a, b, …)``; None when ``node`` is no row constructor."""
    if isinstance(node, exp.Tuple):
        return list(node.expressions)
    if isinstance(node, exp.Anonymous) and node.name.upper() == "ROW":
        return list(node.expressions)
    return None


def _array_needs_coercion(element: PgType, common: PgType) -> bool:
    """Whether ``x op ANY (array)`` converts the array itself (an ArrayCoerceExpr, which the row-filter
    walker rejects) rather than using a cross-type operator (int48eq, float48eq, date_eq_timestamp …).

    No operator takes varchar (pg_operator): ``v = ANY (ARRAY[v, 'a'])`` compares as text, so its
    varchar[] array is converted to text[] even though both sides are varchar."""
    if element.name == "varchar":
        return True
    if element.name == common.name:
        return False
    if (element.is_integer and common.is_integer) or {element.name, common.name} <= {"float4", "float8"}:
        return False
    return {element.name, common.name} != {"date", "timestamp"}


def regex_of(rf, node: exp.Expr) -> tuple[str | None, str | None]:
    """For a ``~``/``~*``/``SIMILAR TO`` node of an analysed filter: (Java pattern, None), or
    (None, PostgreSQL's error) when PostgreSQL raises for every row with a non-NULL subject.
    A NULL pattern gives (None, None). Raises UnsupportedRegex outside the exact subset."""
    escape: str | None = "\\"
    if isinstance(node, exp.Escape):
        escape = rf.constants.get(id(node.expression))
        if not isinstance(escape, str) or len(escape) > 1:
            raise UnsupportedRegex("an ESCAPE that is not one constant character")
        escape = escape or None
        node = node.this
    pattern = rf.constants.get(id(node.expression))
    if id(node.expression) not in rf.constants:
        raise UnsupportedRegex("a pattern that is not a constant")
    if pattern is None:
        return None, None
    collation = (rf.collations.get(id(node.this)) or rf.collations.get(id(node.expression))
                 or rf.context.default_collation)
    icase = isinstance(node, exp.RegexpILike)
    try:
        text = similar_to_regex(str(pattern), escape) if isinstance(node, exp.SimilarTo) else str(pattern)
        return java_regex(text, icase=icase, ascii_classes=collation in ASCII_CTYPE_COLLATIONS), None
    except UnsupportedRegex as e:
        if e.invalid:
            return None, f"invalid regular expression: {e.reason}"
        raise


def folded_error(rf) -> str | None:
    """The error PostgreSQL raises for every row because a call of constants fails when the planner folds it.

    eval_const_expressions (clauses.c) runs a strict immutable function whose arguments are all
    constants once, when the filter is prepared, in whatever branch it stands: ``substr('a', 1, -1)``,
    ``split_part('a', ',', 0)``, ``repeat('ab', 1073741823)`` or ``'a' ~ 'a**'`` make every change of
    the table fail on the publisher. Spark would only raise where the call is evaluated. The planner
    folds an OR's arguments only up to its first constant TRUE, and an AND's up to its first constant
    FALSE (simplify_or_arguments / simplify_and_arguments return at once), a COALESCE's up to its first
    non-null constant, and drops a searched CASE's WHEN that is constant FALSE or NULL, and what follows
    one that is constant TRUE, without folding them: what it does not reach raises nothing.
    """
    for node in _folded(rf, rf.tree):
        args = list(node.iter_expressions())
        if not args or not all(id(a) in rf.constants for a in args):
            continue
        values = [rf.constants[id(a)] for a in args]
        if any(v is None for v in values):
            continue  # strict: NULL in, NULL out, no error
        if isinstance(node, exp.Substring) and len(values) == 3 and int(values[2]) < 0:
            return "negative substring length not allowed"
        if isinstance(node, exp.SplitPart) and int(values[2]) == 0:
            return "field position must not be zero"
        if isinstance(node, exp.Repeat) and len(str(values[0]).encode()) * max(int(values[1]), 0) + 4 > 1073741823:
            return "requested length too large"
        if isinstance(node, (exp.RegexpLike, exp.RegexpILike, exp.SimilarTo, exp.Escape)):
            try:
                error = regex_of(rf, node)[1]
            except UnsupportedRegex:
                continue
            if error is not None:
                return error
    return None


def _folded(rf, node: exp.Expr) -> Iterator[exp.Expr]:
    """``node`` and what eval_const_expressions (clauses.c) reaches below it, pruned as :func:`folded_error` says."""
    yield node
    if isinstance(node, (exp.Or, exp.And)):
        decisive = isinstance(node, exp.Or)  # TRUE ends an OR, FALSE an AND
        for arg in node.flatten():
            yield from _folded(rf, arg)
            value = rf.constants.get(id(arg.unnest()), None)
            if isinstance(value, bool) and value is decisive:
                return
        return
    if isinstance(node, exp.Coalesce):
        # T_CoalesceExpr: the arguments in order, up to the first non-null constant; the rest are dropped
        for arg in (node.this, *node.expressions):
            yield from _folded(rf, arg)
            if _constant(rf, arg) not in (_NOT_CONSTANT, None):
                return
        return
    if isinstance(node, exp.Case) and node.this is None:
        # T_CaseExpr (a searched CASE): a WHEN whose condition folds to FALSE or NULL is dropped with its
        # result unfolded; one that folds to TRUE ends the CASE, its result folded, the rest and ELSE not
        for when in node.args.get("ifs") or ():
            yield from _folded(rf, when.this)
            condition = _constant(rf, when.this)
            if condition is _NOT_CONSTANT or condition is True:
                yield from _folded(rf, when.args["true"])
            if condition is True:
                return
        if node.args.get("default") is not None:
            yield from _folded(rf, node.args["default"])
        return
    for child in node.iter_expressions():
        yield from _folded(rf, child)


_NOT_CONSTANT = object()


def _constant(rf, node: exp.Expr) -> object:
    """The value ``node`` folds to (None: the null constant), or _NOT_CONSTANT."""
    inner = node.unnest()
    return rf.constants[id(inner)] if id(inner) in rf.constants else _NOT_CONSTANT


class TextAnalysis(_Analyzer):
    """Handlers of core/filters/analysis.py's analyzer for the constructs of this module (a mixin: ``self`` is
    that analyzer, whose methods and tables these handlers use)."""

    # --- string functions -------------------------------------------------------------------------
    def _string_function(self, node, args, types, name: str) -> PgType:
        signature = ", ".join(str(t) for t in types)
        kinds = next((k for k in STRING_FUNCTIONS[name] if len(k) == len(args)), None)
        if kinds is None:
            raise self.error(f"function {name}({signature}) does not exist", node)
        for arg, t, kind in zip(args, types, kinds, strict=True):
            if kind == "t" and (t.is_text_family or t.is_unknown):
                self.coerce(arg, t, T.TEXT)
            elif kind == "i" and (t.name in ("int2", "int4")):
                self.coerce(arg, t, T.INT4)
            elif kind == "i" and t.is_unknown and name == "substring":
                # substring(text, text) is the regular-expression form; sqlglot spells substr the same
                raise self.untranslatable(
                    "substring() with a string as its second argument", node,
                    "PostgreSQL reads substring(text, text) as a regular-expression match; write the position as "
                    "an integer, e.g. substr(code, 2)")
            elif kind == "i" and t.is_unknown:
                self.coerce(arg, t, T.INT4)
            else:
                raise self.error(f"function {name}({signature}) does not exist", node,
                                 hint="No function matches the given name and argument types. "
                                 "You might need to add explicit type casts.")
        self._inherit(node, args[0])
        return T.INT4 if name == "position" else T.TEXT

    def _f_substring(self, node, args, types): return self._string_function(node, args, types, "substring")
    def _f_left(self, node, args, types): return self._string_function(node, args, types, "left")
    def _f_right(self, node, args, types): return self._string_function(node, args, types, "right")
    def _f_position(self, node, args, types): return self._string_function(node, args, types, "position")
    def _f_split_part(self, node, args, types): return self._string_function(node, args, types, "split_part")
    def _f_repeat(self, node, args, types): return self._string_function(node, args, types, "repeat")

    # --- regular expressions ----------------------------------------------------------------------
    def _regex(self, node: exp.Expr, op: str) -> PgType:
        quantified = quantified_array(node.expression)
        if quantified is not None:
            return self.quantified_pattern(node, op, *quantified)
        lt, rt = self.analyze(node.this), self.analyze(node.expression)
        for child, t in ((node.this, lt), (node.expression, rt)):
            if not (t.is_text_family or t.is_unknown):
                raise self.error(f"operator does not exist: {lt} {op} {rt}", node,
                                 hint="No operator matches the given name and argument types. "
                                 "You might need to add explicit type casts.")
            if child is node.this and t.name == "bpchar":
                continue  # bpcharregexeq matches the padded value, as bpcharlike does
            self.coerce(child, t, T.TEXT)
        self.check_regex(node)
        return T.BOOL

    def check_regex(self, node: exp.Expr) -> None:
        try:
            regex_of(self, node)
        except UnsupportedRegex as e:
            what = "SIMILAR TO" if isinstance(node, (exp.SimilarTo, exp.Escape)) else "a regular expression"
            raise self.untranslatable(f"{what} with {e.reason}", node, SOURCE_SIDE_FIX) from None

    def _a_RegexpLike(self, node): return self._regex(node, "~")
    def _a_RegexpILike(self, node): return self._regex(node, "~*")

    # --- x op ANY/ALL (ARRAY[…]) --------------------------------------------------------------------
    def quantified(self, node: exp.Expr, op: str, kind: str, array: exp.Expr) -> PgType:
        lt = self.analyze(node.this)
        element = self._array_elements(node, op, kind, array, "write the values as ARRAY[…] or as IN (…)")
        common = self.common_type(lt, element, op, node)
        self.coerce(node.this, lt, common)
        self._array_as(node, array, element, common)
        self._check_comparable(common, node, op, node.this, *array.expressions)
        return T.BOOL

    def _array_elements(self, node: exp.Expr, op: str, kind: str, array: exp.Expr, fix: str) -> PgType:
        """The element type of the ARRAY[…] under ``op ANY/ALL``: ARRAY[…] only, and not empty."""
        if not isinstance(array, exp.Array):
            raise self.untranslatable(f"{op} {kind.upper()} (…) over a value that is not ARRAY[…]", node, fix)
        if not array.expressions:
            raise self.error("cannot determine type of empty array", array,
                             hint="Explicitly cast to the desired type, for example ARRAY[]::integer[].")
        return self._common_of(array, list(array.expressions), "ARRAY")

    def _array_as(self, node: exp.Expr, array: exp.Expr, element: PgType, operand: PgType) -> None:
        """Record the array's elements as compared in ``operand``; an array converted to it is an
        ArrayCoerceExpr, which the row-filter walker rejects."""
        self.types[id(array)] = element
        self.targets[id(array)] = operand
        if _array_needs_coercion(element, operand):
            self.walker_violation(ONLY_SIMPLE, node)

    def quantified_pattern(self, node: exp.Expr, op: str, kind: str, array: exp.Expr) -> PgType:
        """x [NOT] LIKE|ILIKE ANY/ALL (ARRAY[…]), x ~ ANY (…) …: the operator (~~, !~~, ~~*, ~ …) applied to
        each element, as make_scalar_array_op (parse_oper.c) resolves it: the array's element type is the
        operator's right argument, text; a character(n) subject keeps its padding (bpcharlike)."""
        lt = self.analyze(node.this)
        element = self._array_elements(node, op, kind, array,
                                       f"write the patterns as ARRAY[…], or as (x {op} 'a' OR x {op} 'b')")
        element = T.TEXT if element.is_unknown else element  # ARRAY['a%', …] is text[]
        if not ((lt.is_text_family or lt.is_unknown) and element.is_text_family):
            name = {"LIKE": "~~", "ILIKE": "~~*"}.get(op, op)
            raise self.error(f"operator does not exist: {lt} {'!' if node.args.get('negate') else ''}{name} "
                             f"{element}", node, hint="No operator matches the given name and argument types. "
                             "You might need to add explicit type casts.")
        if lt.name != "bpchar":
            self.coerce(node.this, lt, T.TEXT)
        self._array_as(node, array, element, T.TEXT)  # a varchar[] or character(n)[] is converted
        if op in ("~", "~*"):
            # sqlglot reads `t !~ ANY (…)` (the operator !~ on each element) as `NOT t ~ ANY (…)`
            raise self.untranslatable(f"a regular expression {kind.upper()} (ARRAY[…])", node,
                                      f"write it as (x {op} 'a' {'OR' if kind == 'any' else 'AND'} x {op} 'b'), or "
                                      + SOURCE_SIDE_FIX.split(", or ")[0])
        if op == "ILIKE":
            self._require_binary_collation(node, "ILIKE", node.this, *array.expressions)
        return T.BOOL

    # --- ROW(…) IS [NOT] NULL -------------------------------------------------------------------------
    def row_test(self, node: exp.Is, fields: list[exp.Expr]) -> PgType:
        if not isinstance(node.expression, exp.Null):
            truth = "TRUE" if node.expression.this else "FALSE"
            raise self.error(f"argument of IS {truth} must be type boolean, not type record", node.this)
        for f in fields:
            if row_fields(f) is not None:
                raise self.untranslatable("a row inside a row", f, "test the inner row's fields directly")
            t = self.analyze(f)
            if t.is_unknown:
                self.coerce(f, t, T.TEXT)
        self.types[id(node.this)] = PgType("record")
        return T.BOOL

    def _a_Tuple(self, node: exp.Expr) -> PgType:
        raise self.untranslatable("a row constructor outside IS [NOT] NULL", node,
                                  "compare the fields one by one, e.g. (a = 1 AND b = 2)")
