"""Row filters, semantics of the string functions, regular expressions, ANY/ALL and row tests.

A mixin of core/filters/analysis.py's analyzer (same attributes: ``types``, ``targets``,
``constants``, ``collations``, ``context``): it types ``substr``/``substring``, ``left``, ``right``,
``strpos``/``position``, ``split_part``, ``repeat``, the pattern operators ``~ ~* !~ !~*`` and
``SIMILAR TO``, ``x op ANY/ALL (ARRAY[…])``, ``ROW(…) IS [NOT] NULL`` and row comparisons as PostgreSQL's parse
analysis does (parse_func.c, parse_oper.c ``make_scalar_array_op``, parse_expr.c
``transformArrayExpr``), and decides which regular expressions Spark can evaluate exactly
(core/filters/regex.py). core/filters/spark_translation.py renders them.
"""

from __future__ import annotations

import decimal
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.constants import NumericFieldOverflow, numeric_typmod
from airflow_provider_rowfilter.core.filters.grammar import ONLY_SIMPLE, quantified_array, row_fields
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


def regex_of(rf, node: exp.Expr, pattern_node: exp.Expr | None = None) -> tuple[str | None, str | None]:
    """For a ``~``/``~*``/``SIMILAR TO`` node of an analysed filter: (Java pattern, None), or
    (None, PostgreSQL's error) when PostgreSQL raises for every row with a non-NULL subject.
    A NULL pattern gives (None, None). Raises UnsupportedRegex outside the exact subset. ``pattern_node``: the
    element of ``x ~ ANY (ARRAY[…])`` taken as the pattern, instead of the node's right operand."""
    escape: str | None = "\\"
    if isinstance(node, exp.Escape):
        escape = rf.constants.get(id(node.expression))
        if not isinstance(escape, str) or len(escape) > 1:
            raise UnsupportedRegex("an ESCAPE that is not one constant character")
        escape = escape or None
        node = node.this
    pattern_node = node.expression if pattern_node is None else pattern_node
    pattern = rf.constants.get(id(pattern_node))
    if id(pattern_node) not in rf.constants:
        raise UnsupportedRegex("a pattern that is not a constant")
    if pattern is None:
        return None, None
    collation = (rf.collations.get(id(node.this)) or rf.collations.get(id(pattern_node))
                 or rf.context.default_collation)
    icase = isinstance(node, exp.RegexpILike)
    try:
        text = similar_to_regex(str(pattern), escape) if isinstance(node, exp.SimilarTo) else str(pattern)
        return java_regex(text, icase=icase, ascii_classes=collation in ASCII_CTYPE_COLLATIONS), None
    except UnsupportedRegex as e:
        if e.invalid:
            return None, f"invalid regular expression: {e.reason}"
        raise


# What a constant field of a row under ANY/ALL may be made of: a literal and its casts, which the planner folds
# (core/filters/folding.py: a cast that raises, raises for every row).
_CONSTANT_PARTS = (exp.Literal, exp.Null, exp.Boolean, exp.Cast, exp.DataType, exp.DataTypeParam, exp.Neg, exp.Paren)


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
        element = self._array_elements(node, op, kind, array, "write the values as ARRAY[…] or as IN (…)",
                                       column=True)
        common = self.common_type(lt, element, op, node)
        self.coerce(node.this, lt, common)
        if element.is_unknown:  # '{1,2}': read as an array of the operator's type, a constant (no conversion)
            element = self._array_literal(array, common)
        self._array_as(node, array, element, common)
        self._check_comparable(common, node, op, node.this, *(array.expressions if isinstance(array, exp.Array)
                                                               else [array]))
        return T.BOOL

    def _array_elements(self, node: exp.Expr, op: str, kind: str, array: exp.Expr, fix: str,
                        column: bool = False) -> PgType:
        """The element type of the array under ``op ANY/ALL``: ARRAY[…], not empty; a column of an array type,
        whose elements Spark reads from PostgreSQL's text form (spark_translation.py ``typed_read``); an array
        constant (``'{1,2}'::int[]``); or an untyped literal (``'{1,2}'``), UNKNOWN here: make_scalar_array_op
        resolves the operator with it unknown, then reads it as an array of the operator's right argument."""
        if not isinstance(array, exp.Array):
            t = self.analyze(array)
            if t.element is not None and self._exact_array(array):
                return t.element
            if t.is_unknown and id(array) in self.constants:
                return t
            what = "ARRAY[…], an array column, an array constant, or COALESCE or CASE of those"
            raise self.untranslatable(f"{op} {kind.upper()} (…) over a value that is not {what}", node, fix)
        if not array.expressions:
            raise self.error("cannot determine type of empty array", array,
                             hint="Explicitly cast to the desired type, for example ARRAY[]::integer[].")
        return self._common_of(array, list(array.expressions), "ARRAY")

    def _exact_array(self, array: exp.Expr) -> bool:
        """Whether Spark computes the (analysed) array expression exactly, elements in order: an array column or
        constant, cast to its own type or not, or COALESCE / CASE (ExecEvalCoalesce, ExecEvalCase: the value of one
        branch, untouched) whose results are such arrays. Not NULLIF (array_eq compares dimensions and lower bounds,
        which Spark's flattened arrays lose: refused as a comparison of arrays), nor ``||`` (refused where typed)."""
        while isinstance(array, exp.Paren):
            array = array.this
        if isinstance(array, exp.Column) or id(array) in self.constants:
            return True
        if isinstance(array, exp.Cast) and self.types.get(id(array.this)) == self.types.get(id(array)):
            return self._exact_array(array.this)  # ia::int[]: no conversion (coerce_type adds no node)
        if isinstance(array, exp.Coalesce):
            return all(self._exact_array(e) for e in (array.this, *array.expressions))
        if isinstance(array, exp.Case):
            results = [i.args["true"] for i in array.args.get("ifs") or []]
            default = array.args.get("default")
            return all(self._exact_array(e) for e in (*results, *([default] if default is not None else [])))
        return False

    def _array_literal(self, array: exp.Expr, element: PgType) -> PgType:
        """An untyped literal under ANY/ALL read as ``element[]`` by array_in (core/filters/constants.py), as
        PostgreSQL reads it when it parses the filter (a malformed one is its error there)."""
        if element.element is not None:
            raise self.untranslatable("an array of arrays under ANY/ALL", array,
                                      "compare the arrays' elements instead")
        t = PgType("_array", element=element)
        if element.name == "numeric" and element.precision is not None:
            # numeric_eq compares the literal's own digits, not rounded to the other side's scale: kept only when
            # every element is exactly a value of that numeric(p,s) (NaN and the infinities are values of any)
            values = self.literal_value(array, self.constants[id(array)], PgType("_array", element=T.NUMERIC))
            assert isinstance(values, list)
            for v in values:
                try:
                    exact = not isinstance(v, decimal.Decimal) or not v.is_finite() \
                        or numeric_typmod(v, element.precision, element.scale or 0) == v
                except NumericFieldOverflow:
                    exact = False
                if not exact:
                    raise self.untranslatable(
                        f"an array constant with more digits than numeric({element.precision},{element.scale or 0})",
                        array, "write the elements within the column's precision and scale, or as ARRAY[…] of numbers")
            self.constants[id(array)] = values
        else:
            self.constants[id(array)] = self.literal_value(array, self.constants[id(array)], t)
        self.types[id(array)] = t
        return element

    def _array_as(self, node: exp.Expr, array: exp.Expr, element: PgType, operand: PgType) -> None:
        """Record the array's elements as compared in ``operand``; an array converted to it is an
        ArrayCoerceExpr, which the row-filter walker rejects. An array column keeps its own type; its target
        is the array of ``operand``."""
        if isinstance(array, exp.Array):
            self.types[id(array)] = element
            self.targets[id(array)] = operand
        else:
            self.targets[id(array)] = PgType("_array", element=operand)
        if _array_needs_coercion(element, operand):
            self.walker_violation(ONLY_SIMPLE, node)

    def quantified_pattern(self, node: exp.Expr, op: str, kind: str, array: exp.Expr) -> PgType:
        """x [NOT] LIKE|ILIKE ANY/ALL (ARRAY[…]), x ~ ANY (…) …: the operator (~~, !~~, ~~*, ~ …) applied to
        each element, as make_scalar_array_op (parse_oper.c) resolves it: the array's element type is the
        operator's right argument, text; a character(n) subject keeps its padding (bpcharlike)."""
        lt = self.analyze(node.this)
        element = self._array_elements(node, op, kind, array,
                                       f"write the patterns as ARRAY[…], or as (x {op} 'a' OR x {op} 'b')",
                                       column=True)
        if element.is_unknown and not isinstance(array, exp.Array):
            element = self._array_literal(array, T.TEXT)  # '{a%,b%}': the operator's right argument, text[]
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
            # the operator (~, !~, ~*, !~*: core/filters/grammar.py reads `t !~ ANY (…)` as the operator !~ on
            # each element) with each element as its pattern, each a constant in the exact subset
            if node.args.get("unread"):
                raise self.untranslatable(f"a regular expression {kind.upper()} (ARRAY[…]) whose operator (~ or !~) "
                                          "could not be told from the text", node,
                                          f"write it as (x {op} 'a' {'OR' if kind == 'any' else 'AND'} x {op} 'b')")
            if not isinstance(array, exp.Array):
                raise self.untranslatable(f"a regular expression {kind.upper()} over an array column or '{{…}}'",
                                          node, "write the patterns as ARRAY['a', 'b'], or "
                                          + SOURCE_SIDE_FIX.split(", or ")[0])
            for element in array.expressions:
                try:
                    regex_of(self, node, element)
                except UnsupportedRegex as e:
                    raise self.untranslatable(f"a regular expression with {e.reason}", element,
                                              SOURCE_SIDE_FIX) from None
        if op == "ILIKE":
            self._require_binary_collation(node, "ILIKE", node.this,
                                           *(array.expressions if isinstance(array, exp.Array) else [array]))
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

    # --- array containment and overlap ------------------------------------------------------------------
    def array_operator(self, node: exp.Binary, op: str) -> PgType:
        """``a @> b``, ``a <@ b``, ``a && b`` (arraycontains, arraycontained, arrayoverlap: anyarray on both sides,
        so both arrays of one type; an untyped ``'{…}'`` takes the other side's). The operands are ARRAY[…], an
        array column or an array constant, as under ANY/ALL."""
        sides = (node.this, node.expression)
        types = []
        for side in sides:
            if isinstance(side, exp.Array):
                if not side.expressions:
                    raise self.error("cannot determine type of empty array", side,
                                     hint="Explicitly cast to the desired type, for example ARRAY[]::integer[].")
                element = self._common_of(side, list(side.expressions), "ARRAY")
                self.types[id(side)] = PgType("_array", element=element)
                types.append(self.types[id(side)])
                continue
            t = self.analyze(side)
            if t.element is None and not (t.is_unknown and id(side) in self.constants):
                raise self.untranslatable(f"{op} over a value that is not ARRAY[…], an array column or an array "
                                          "constant", node, "compare ARRAY[…] or array columns")
            types.append(t)
        if all(t.is_unknown for t in types):
            raise self.untranslatable(f"{op} of two untyped literals", node, "cast one of them, e.g. '{1}'::int[]")
        for i, side in enumerate(sides):
            if types[i].is_unknown:
                known = types[1 - i]
                assert known.element is not None
                self._array_literal(side, known.element)
                types[i] = known
        left, right = types
        assert left.element is not None and right.element is not None
        if left.element.name != right.element.name or left.element.element is not None:
            raise self.error(f"operator does not exist: {left} {op} {right}", node,
                             hint="No operator matches the given name and argument types. "
                             "You might need to add explicit type casts.")
        self._require_spark_type(left.element, node)
        if left.element.is_text_family:
            self._require_binary_collation(node, f"{op} on text arrays", *sides, fix=(
                'compare under COLLATE "C" (code-point equality, which Spark uses)'))
        return T.BOOL

    def _a_ArrayContainsAll(self, node): return self.array_operator(node, "@>")
    def _a_ArrayContainedBy(self, node): return self.array_operator(node, "<@")
    def _a_ArrayOverlaps(self, node): return self.array_operator(node, "&&")

    # --- row comparisons ------------------------------------------------------------------------------
    def row_comparison(self, node: exp.Binary, op: str, left: list[exp.Expr] | None,
                       right: list[exp.Expr] | None) -> PgType:
        """``(a, b) op (c, d)`` (``= <> < <= > >=``, ``IS [NOT] DISTINCT FROM``), as make_row_comparison_op and
        make_row_distinct_op (parse_expr.c) build it: one operator per pair of fields, each resolved on its own
        (``(i4, t) = (i8, v)`` compares i4 with i8 as bigint, t with v as text)."""
        if left is None or right is None:
            raise self.untranslatable("a row compared with a value that is not a row constructor", node,
                                      "compare the fields one by one, e.g. (a = 1 AND b = 2)")
        if len(left) != len(right):
            raise self.error("unequal number of entries in row expressions", node)
        if not left:
            raise self.error("cannot compare rows of zero length", node)
        for a, b in zip(left, right, strict=True):
            if row_fields(a) is not None or row_fields(b) is not None:
                raise self.untranslatable("a row inside a row", a if row_fields(a) is not None else b,
                                          "compare the inner row's fields directly")
            common = self._operands(node, a, b, op)
            self._check_comparable(common, node, op, a, b)
        self.types[id(node.left)] = self.types[id(node.right)] = PgType("record")
        return T.BOOL

    def row_quantified(self, node: exp.Binary, op: str, kind: str, array: exp.Expr) -> PgType:
        """``(a, b) = ANY/ALL (ARRAY[ROW(…), …])`` (and ``<>``): make_scalar_array_op (parse_oper.c) resolves
        ``record = record`` (record_eq, rowtypes.c), applied to each element by ExecEvalScalarArrayOp. Each field
        keeps its own type (``'x'`` and NULL stay ``unknown``), checked only when record_eq reaches it; its fields
        are columns or constants here (none can raise, so evaluating them first or on the way is the same)."""
        fix = "compare the fields one by one, e.g. ((a = 1 AND b = 'x') OR (a = 2 AND b = 'y'))"
        if op not in ("=", "<>") or not isinstance(array, exp.Array) or not array.expressions \
                or any(not row_fields(e) for e in array.expressions):
            raise self.untranslatable(f"a row {op} {kind.upper()} (…) other than = or <> over ARRAY[ROW(…), …]",
                                      node, fix)
        rows = [row_fields(node.left) or [], *(row_fields(e) or [] for e in array.expressions)]
        if not rows[0] or not any(isinstance(f, exp.Column) for f in rows[0]):
            raise self.untranslatable("a row of constants under ANY/ALL", node, fix)
        for row in rows:
            for f in row:
                if row_fields(f) is not None:
                    raise self.untranslatable("a row inside a row", f, "compare the inner row's fields directly")
                t = self.analyze(f)
                if not (isinstance(f.unnest(), exp.Column) or id(f) in self.constants or all(
                        isinstance(n, _CONSTANT_PARTS) for n in f.walk())):
                    raise self.untranslatable("a computed field of a row under ANY/ALL", f, fix)
                if not t.is_unknown:
                    self._check_comparable(t, node, op, f)  # an array field: array_eq (refused), else the type
        self.types[id(node.left)] = PgType("record")
        for e in array.expressions:
            self.types[id(e)] = PgType("record")
        return T.BOOL

    def _a_Tuple(self, node: exp.Expr) -> PgType:
        raise self.untranslatable("a row constructor outside IS [NOT] NULL", node,
                                  "compare the fields one by one, e.g. (a = 1 AND b = 2)")
