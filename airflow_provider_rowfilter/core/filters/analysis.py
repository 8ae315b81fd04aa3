"""Row filters, semantics: type one parsed filter and check it as PostgreSQL's parse analysis does.

Two passes mirror PostgreSQL: parse analysis (``transformWhereClause``: names, types, operators,
aggregates) raises first; then the restrictions of ``check_simple_rowfilter_expr_walker``
(publicationcmds.c) are checked in prefix order and the first violation is raised with
PostgreSQL's text. :func:`analyze` returns the type of every node, the type its parent coerces it
to, its collation and, for constants, their value: what core/filters/spark_translation.py reads, so both
share one notion of each node's type. The syntax is core/filters/grammar.py's, constant values
core/filters/constants.py's.
"""

from __future__ import annotations

import decimal
import unicodedata
from dataclasses import dataclass, field

from sqlglot import exp

from airflow_provider_rowfilter.core.errors import (
    InvalidRowFilterError,
    PublicationError,
    UntranslatableFilterError,
)
from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.constants import (
    InvalidConstant,
    UnrepresentableConstant,
    constant_value,
    decimal_type,
)
from airflow_provider_rowfilter.core.filters.dialect import identifier_name
from airflow_provider_rowfilter.core.filters.functions import (
    AGGREGATES,
    SET_RETURNING,
    WINDOW_FUNCTIONS,
    FunctionCatalog,
    function_name,
)
from airflow_provider_rowfilter.core.filters.grammar import INVALID, ONLY_SIMPLE, node_position
from airflow_provider_rowfilter.core.filters.pg_types import PgType
from airflow_provider_rowfilter.core.filters.text import TextAnalysis, quantified_array, row_fields
from airflow_provider_rowfilter.core.relation import SYSTEM_COLUMNS, Relation

MUTABLE = "User-defined or built-in mutable functions are not allowed."
USER_TYPE = "User-defined types are not allowed."
USER_COLLATION = "User-defined collations are not allowed."
SYSTEM_COLUMN = "System columns are not allowed."

# The type of nodes the walker rejects anyway (system columns, subqueries, whole-row references):
# PostgreSQL resolves their operators, so analysis must not fail on them first.
ANY = PgType("any")

# Keywords PostgreSQL 18 still parses into SQLValueFunction nodes, which the walker does not allow.
SQL_VALUE_FUNCTIONS = frozenset({"current_user", "session_user", "user", "current_role", "current_catalog",
                                 "current_schema"})

_BINARY_CAST = {("text", "varchar"), ("varchar", "text"), ("varchar", "varchar"), ("text", "text")}
_IMMUTABLE_FUNCTION_CASTS = {
    ("bpchar", "text"), ("bpchar", "varchar"), ("date", "timestamp"), ("timestamp", "date"),
    ("int4", "bool"), ("bool", "int4"), ("float4", "float8"), ("float8", "float4"),
}
_STABLE_CASTS = {
    ("date", "timestamptz"), ("timestamp", "timestamptz"), ("timestamptz", "timestamp"),
    ("timestamptz", "date"),
}


#: Type families whose = operators take any two members as they are (pg_operator: int24eq, int48eq, float48eq,
#: date_eq_timestamp, timestamp_eq_timestamptz …).
_CROSS_TYPE_EQUALITY = ({"int2", "int4", "int8"}, {"float4", "float8"}, {"date", "timestamp", "timestamptz"})


@dataclass(frozen=True)
class FilterContext:
    """What the publisher contributes to analysis: its functions, default collation and time zone."""

    functions: FunctionCatalog = field(default_factory=FunctionCatalog)
    default_collation: str = "C"
    timezone: str = "UTC"



def analyze(sql: str, tree: exp.Expr, relation: Relation, context: FilterContext) -> _Analyzer:
    """Type ``tree`` (the parsed ``sql``) as a filter of ``relation``; raise the error PostgreSQL would.

    The result's maps are keyed by ``id()`` of the nodes of its :attr:`_Analyzer.tree` (``tree``).
    """
    analyzer = _Analyzer(sql, relation, context)
    analyzer.tree = tree
    try:
        result = analyzer.analyze(tree)
    except UntranslatableFilterError:
        # PostgreSQL's own rejection comes first: what it refuses is not ours to call untranslatable
        if analyzer.violation is not None:
            detail, node = analyzer.violation
            raise InvalidRowFilterError(INVALID, detail=detail, source=sql, position=node_position(node)) from None
        raise
    if result.name != "bool" and not result.is_unknown:
        raise InvalidRowFilterError(
            f"argument of PUBLICATION WHERE must be type boolean, not type {result}",
            source=sql, position=node_position(tree),
        )
    analyzer.coerce(tree, result, T.BOOL)
    if analyzer.violation is not None:
        detail, node = analyzer.violation
        raise InvalidRowFilterError(INVALID, detail=detail, source=sql, position=node_position(node))
    return analyzer


def _odd_space_hint(name: str) -> str | None:
    """PostgreSQL reads a non-ASCII space as part of a name (scan.l ident_cont): say which one it is."""
    odd = next((c for c in name if c.isspace()), None)
    if odd is None:
        return None
    return (f"the name holds U+{ord(odd):04X} ({unicodedata.name(odd, 'a space')}), which PostgreSQL reads as a "
            "letter of the name, not as a space: replace it with an ordinary space")



class _Analyzer(TextAnalysis):
    """Parse analysis with PostgreSQL's errors; walker violations are remembered in prefix order."""

    def __init__(self, sql: str, relation: Relation, context: FilterContext) -> None:
        self.sql = sql
        self.relation = relation
        self.context = context
        self.types: dict[int, PgType] = {}
        self.targets: dict[int, PgType] = {}
        self.collations: dict[int, str | None] = {}
        self.constants: dict[int, object] = {}
        self.columns: set[str] = set()
        self.violation: tuple[str, exp.Expr] | None = None
        self.tree: exp.Expr | None = None  # the analysed tree (set by analyze())
        self._violation_rank = 1 << 60

    # --- errors -----------------------------------------------------------------------------------
    def error(self, message: str, node: exp.Expr, *, hint: str | None = None) -> PublicationError:
        return InvalidRowFilterError(message, source=self.sql, position=node_position(node), hint=hint)

    def walker_violation(self, detail: str, node: exp.Expr) -> None:
        rank = _prefix_rank(node)
        if rank < self._violation_rank:
            self._violation_rank = rank
            self.violation = (detail, node)

    def untranslatable(self, what: str, node: exp.Expr, fix: str) -> UntranslatableFilterError:
        return UntranslatableFilterError(
            f"{what} cannot be evaluated by Spark with exactly PostgreSQL's meaning",
            hint=fix, source=self.sql, position=node_position(node),
        )

    # --- entry ------------------------------------------------------------------------------------
    def analyze(self, node: exp.Expr) -> PgType:
        t = self._analyze(node)
        self.types[id(node)] = t
        return t

    def coerce(self, node: exp.Expr, actual: PgType, wanted: PgType) -> None:
        """Record that ``node`` (of type ``actual``) is converted to ``wanted`` by its parent."""
        if actual != wanted:
            self.targets[id(node)] = wanted
        if actual.is_unknown and id(node) in self.constants:
            # An implicit coercion of a literal ignores varchar(n)/character(n) lengths (PostgreSQL
            # coerces to the bare type; only an explicit cast or an assignment applies the length).
            bare = PgType(wanted.name) if wanted.is_text_family else wanted
            self.constants[id(node)] = self.literal_value(node, self.constants[id(node)], bare)

    def _analyze(self, node: exp.Expr) -> PgType:
        handler = getattr(self, f"_a_{type(node).__name__}", None)
        if handler is not None:
            return handler(node)
        if isinstance(node, (exp.Subquery, exp.Select, exp.Exists)):
            self.walker_violation(ONLY_SIMPLE, node)
            return ANY
        if isinstance(node, exp.Window):
            raise self.error("window functions are not allowed in WHERE", node)
        if isinstance(node, exp.AggFunc):
            raise self.error("aggregate functions are not allowed in WHERE", node)
        if isinstance(node, exp.Func):
            return self._function(node)
        raise self.untranslatable(f"expression {node.sql(dialect='postgres')!r}", node,
                                  "rewrite the filter with comparisons, boolean logic, arithmetic, "
                                  "CASE, COALESCE, IN, BETWEEN, LIKE or the functions in docs/row-filters.md")

    # --- leaves -----------------------------------------------------------------------------------
    def _a_Paren(self, node: exp.Paren) -> PgType:
        t = self.analyze(node.this)
        self._inherit(node, node.this)
        if id(node.this) in self.constants:
            self.constants[id(node)] = self.constants[id(node.this)]
        return t

    def _inherit(self, node: exp.Expr, child: exp.Expr) -> None:
        # Only the collation: lower('AB'), replace('ab', …) or NULLIF('', …) are not the constant 'AB'.
        self.collations[id(node)] = self.collations.get(id(child))

    def _a_Column(self, node: exp.Column) -> PgType:
        name = identifier_name(node.this)
        qualifier = identifier_name(node.args.get("table"))
        if qualifier and qualifier != self.relation.name.name:
            raise self.error(f'missing FROM-clause entry for table "{qualifier}"', node)
        col = self.relation.column(name)
        if col is None:
            if name in SYSTEM_COLUMNS:
                self.walker_violation(SYSTEM_COLUMN, node)
                return ANY
            if name == self.relation.name.name and not qualifier:
                # whole-row reference: a Var of the table's row type, which is user-defined
                self.walker_violation(USER_TYPE, node)
                return ANY
            raise self.error(f'column "{name}" does not exist', node, hint=_odd_space_hint(name))
        self.columns.add(name)
        if col.user_defined_type:
            self.walker_violation(USER_TYPE, node)
        t = T.parse_type(col.type_name)
        if t.name == "numeric" and t.precision is None:
            # Its values may hold up to 131072 digits; the apply reads each column as its Spark type,
            # and DECIMAL holds 38: even numeric_col IS NULL or numeric_col::numeric(20,2) could not be read.
            raise self.untranslatable(
                f'the column "{name}" of type numeric without a precision', node,
                f"declare it numeric(p,s) with p <= {T.SPARK_MAX_DECIMAL_PRECISION} on the publisher (ALTER TABLE … "
                "ALTER COLUMN … TYPE numeric(20,2)), or publish from the catalog of a PostgreSQL 15+ publisher, "
                "where PostgreSQL evaluates the filter itself")
        if t.element is not None and T.spark_type(t) is None:
            raise self.untranslatable(
                f'the column "{name}" of type {t}', node,
                "filter on arrays of the types listed in docs/row-filters.md, or publish from the catalog of a "
                "PostgreSQL 15+ publisher, where PostgreSQL evaluates the filter itself")
        if t.is_text_family or (t.element is not None and t.element.is_text_family):
            coll = col.collation
            self.collations[id(node)] = self.context.default_collation if coll in (None, "default") else coll
        return t

    def _a_Literal(self, node: exp.Literal) -> PgType:
        if node.is_string:
            self.constants[id(node)] = node.this
            return T.UNKNOWN
        text = node.this
        if all(c.isdigit() for c in text):
            value = int(text)
            self.constants[id(node)] = value
            return T.integer_literal_type(value)
        number = decimal.Decimal(text)
        self.constants[id(node)] = number
        return decimal_type(number)

    def _a_ByteString(self, node: exp.Expr) -> PgType:
        """``E'…'``: an unknown-type literal; core/filters/pg_lexer.py decoded its escapes as PostgreSQL does."""
        self.constants[id(node)] = node.this
        return T.UNKNOWN

    def _a_RawString(self, node: exp.Expr) -> PgType:
        """``$$…$$`` / ``$tag$…$tag$``: an unknown-type literal whose body is taken as written (scan.l xdolq)."""
        self.constants[id(node)] = node.this
        return T.UNKNOWN

    def _a_Boolean(self, node: exp.Boolean) -> PgType:
        self.constants[id(node)] = bool(node.this)
        return T.BOOL

    def _a_Null(self, node: exp.Null) -> PgType:
        self.constants[id(node)] = None
        return T.UNKNOWN

    # --- boolean logic ----------------------------------------------------------------------------
    def _bool_arg(self, node: exp.Expr, child: exp.Expr, op: str) -> None:
        t = self.analyze(child)
        if t.name != "bool" and not t.is_unknown and t != ANY:
            raise self.error(f"argument of {op} must be type boolean, not type {t}", child)
        self.coerce(child, t, T.BOOL)

    def _a_And(self, node: exp.And) -> PgType:
        self._bool_arg(node, node.left, "AND")
        self._bool_arg(node, node.right, "AND")
        return T.BOOL

    def _a_Or(self, node: exp.Or) -> PgType:
        self._bool_arg(node, node.left, "OR")
        self._bool_arg(node, node.right, "OR")
        return T.BOOL

    def _a_Not(self, node: exp.Not) -> PgType:
        if isinstance(node.this, (exp.Like, exp.ILike, exp.SimilarTo, exp.Between, exp.In, exp.Escape)):
            self.analyze(node.this)
            return T.BOOL
        self._bool_arg(node, node.this, "NOT")
        return T.BOOL

    def _a_Is(self, node: exp.Is) -> PgType:
        fields = row_fields(node.this)
        if fields is not None:
            return self.row_test(node, fields)
        t = self.analyze(node.this)
        if isinstance(node.expression, exp.Boolean):
            if t.name != "bool" and not t.is_unknown:
                raise self.error(f"argument of IS {'TRUE' if node.expression.this else 'FALSE'} must be "
                                 f"type boolean, not type {t}", node.this)
            self.coerce(node.this, t, T.BOOL)
        elif t.is_unknown:
            self.coerce(node.this, t, T.TEXT)
        return T.BOOL

    # --- comparisons and operators ----------------------------------------------------------------
    def _operands(self, node: exp.Expr, left: exp.Expr, right: exp.Expr, op: str) -> PgType:
        """Resolve a binary operator's input type the way PostgreSQL's operator lookup would."""
        lt, rt = self.analyze(left), self.analyze(right)
        common = self.common_type(lt, rt, op, node)
        self.coerce(left, lt, common)
        self.coerce(right, rt, common)
        return common

    def common_type(self, lt: PgType, rt: PgType, op: str, node: exp.Expr) -> PgType:
        if ANY in (lt, rt):  # already rejected by the walker; PostgreSQL resolves these operators
            return ANY
        if lt.is_unknown and rt.is_unknown:
            return T.TEXT
        if lt.is_unknown:
            return self._unknown_to(rt)
        if rt.is_unknown:
            return self._unknown_to(lt)
        if lt == rt:
            return lt
        numeric = T.numeric_common(lt, rt)
        if numeric is not None:
            if numeric.name == "numeric":
                return self._numeric_result(lt, rt)
            return numeric
        if lt.is_text_family and rt.is_text_family:
            # Operator resolution: text wins as the preferred type when either side is text;
            # otherwise character's own operators (bpchareq …) match one side exactly, so
            # varchar = character compares as character (v::bpchar = c).
            if "text" not in (lt.name, rt.name) and "bpchar" in (lt.name, rt.name):
                return PgType("bpchar")
            return T.TEXT
        if {lt.name, rt.name} == {"date", "timestamp"}:
            return T.TIMESTAMP
        if {lt.name, rt.name} in ({"date", "timestamptz"}, {"timestamp", "timestamptz"}):
            self.walker_violation(MUTABLE, node)
            return T.TIMESTAMPTZ
        if lt.name == rt.name:
            return PgType(lt.name)
        raise self.error(f"operator does not exist: {lt} {op} {rt}", node,
                         hint="No operator matches the given name and argument types. "
                         "You might need to add explicit type casts.")

    @staticmethod
    def _unknown_to(t: PgType) -> PgType:
        return PgType("bpchar") if t.name == "bpchar" else (T.TEXT if t.name == "varchar" else t)

    @staticmethod
    def _numeric_result(lt: PgType, rt: PgType) -> PgType:
        """numeric with the smallest precision/scale that holds both sides exactly (for Spark)."""
        def bounds(t: PgType) -> tuple[int | None, int]:
            if t.name == "numeric":
                return (None if t.precision is None else t.precision - (t.scale or 0)), t.scale or 0
            return {"int2": 5, "int4": 10, "int8": 19}[t.name], 0
        (li, ls), (ri, rs) = bounds(lt), bounds(rt)
        if li is None or ri is None:
            return T.NUMERIC
        scale = max(ls, rs)
        return PgType("numeric", max(li, ri) + scale, scale)

    def _comparison(self, node: exp.Binary, op: str) -> PgType:
        quantified = quantified_array(node.expression)
        if quantified is not None:
            return self.quantified(node, op, *quantified)
        common = self._operands(node, node.left, node.right, op)
        self._check_comparable(common, node, op, node.left, node.right)
        return T.BOOL

    def _check_comparable(self, common: PgType, node: exp.Expr, op: str, *operands: exp.Expr) -> None:
        if common.name == "bool" and op not in ("=", "<>"):
            return
        if common.is_text_family and op not in ("=", "<>"):
            self._require_binary_collation(node, "ordering text", *operands, fix=(
                'compare with COLLATE "C" (code-point order, which Spark uses), e.g. (name COLLATE "C" < \'m\')'))
        self._require_spark_type(common, node)

    def _require_spark_type(self, t: PgType, node: exp.Expr) -> None:
        if t.name in ("unknown", "bool", "any") or t.is_text_family:
            return
        if t.name == "numeric" and (t.precision is None or t.precision > T.SPARK_MAX_DECIMAL_PRECISION):
            raise self.untranslatable(
                f"numeric without a precision of at most {T.SPARK_MAX_DECIMAL_PRECISION} digits", node,
                "declare the column numeric(p,s) with p <= 38 on the publisher, or cast the expression in the "
                "filter (e.g. (a * b)::numeric(20,2) > 100)")
        if T.spark_type(t) is None:
            raise self.untranslatable(f"type {t}", node,
                                      "filter on columns of the types listed in docs/row-filters.md")

    def _a_EQ(self, node):  return self._comparison(node, "=")
    def _a_NEQ(self, node): return self._comparison(node, "<>")
    def _a_GT(self, node):  return self._comparison(node, ">")
    def _a_GTE(self, node): return self._comparison(node, ">=")
    def _a_LT(self, node):  return self._comparison(node, "<")
    def _a_LTE(self, node): return self._comparison(node, "<=")
    def _a_NullSafeEQ(self, node):  return self._comparison(node, "=")
    def _a_NullSafeNEQ(self, node): return self._comparison(node, "=")

    def _a_Between(self, node: exp.Between) -> PgType:
        # x >= low AND x <= high: each comparison resolves its own operator (c BETWEEN v AND t
        # compares c >= v::bpchar and c::text <= t); the translation converts x per bound
        xt = self.analyze(node.this)
        for bound in (node.args["low"], node.args["high"]):
            bt = self.analyze(bound)
            pair = self.common_type(xt, bt, ">=", node)
            self.coerce(bound, bt, pair)
            self._check_comparable(pair, node, "<", node.this, bound)
            if xt.is_unknown:
                self.coerce(node.this, xt, pair)
        return T.BOOL

    def _a_In(self, node: exp.In) -> PgType:
        if node.args.get("query") or any(isinstance(e, (exp.Select, exp.Subquery)) for e in node.expressions):
            self.analyze(node.this)
            self.walker_violation(ONLY_SIMPLE, node.args.get("query") or node.expressions[0])
            return T.BOOL
        lt = self.analyze(node.this)
        types = {id(e): self.analyze(e) for e in node.expressions}
        array, pairwise = in_list_groups(node)
        common = T.TEXT
        if array:
            # x = ANY (ARRAY[…]) over the column-free items, in the common type of x and those items
            common = lt
            for e in array:
                common = self.common_type(common, types[id(e)], "=", node)
            for e in array:
                self.coerce(e, types[id(e)], common)
            self._check_comparable(common, node, "=", node.this, *array)
            known = [t for t in (lt, *(types[id(e)] for e in array)) if not t.is_unknown]
            if known and all(t.name == "varchar" for t in known):
                # varchar has no "=" of its own: PostgreSQL compares as text and wraps the
                # varchar[] array in an ArrayCoerceExpr, which the row-filter walker rejects
                # (so v IN ('a', 'b') is refused, while v = 'a' OR v = 'b' is fine)
                self.walker_violation(ONLY_SIMPLE, node)
        for e in pairwise:
            # x = item, each resolved as its own operator: the translation converts x per item
            pair = self.common_type(lt, types[id(e)], "=", node)
            self.coerce(e, types[id(e)], pair)
            self._check_comparable(pair, node, "=", node.this, e)
        if lt.is_unknown:
            self.coerce(node.this, lt, common)
        return T.BOOL

    def _arith(self, node: exp.Binary, op: str) -> PgType:
        lt, rt = self.analyze(node.left), self.analyze(node.right)
        if lt.name == "date" and op in "+-" and (rt.is_integer or rt.is_unknown):
            self.coerce(node.right, rt, T.INT4)
            return T.DATE
        if lt.name == "date" and rt.name == "date" and op == "-":
            return T.INT4
        lt_ = T.INT4 if lt.is_unknown else lt
        rt_ = T.INT4 if rt.is_unknown else rt
        common = T.numeric_common(lt_, rt_)
        if common is None:
            raise self.error(f"operator does not exist: {lt} {op} {rt}", node,
                             hint="No operator matches the given name and argument types. "
                             "You might need to add explicit type casts.")
        if op == "%" and common.name in ("float4", "float8"):
            raise self.error(f"operator does not exist: {lt} % {rt}", node)
        if common.name == "numeric":
            common = self._numeric_arith(lt_, rt_, op, node)
        self.coerce(node.left, lt, common if common.name != "numeric" else lt_)
        self.coerce(node.right, rt, common if common.name != "numeric" else rt_)
        return common

    def _numeric_arith(self, lt: PgType, rt: PgType, op: str, node: exp.Expr) -> PgType:
        if op == "/":
            raise self.untranslatable(
                "numeric division", node,
                "PostgreSQL picks the result scale of numeric division from the values; multiply instead "
                "(a > 2 * b rather than a / b > 2), or divide as double precision (a::float8 / b)")
        def ps(t: PgType) -> tuple[int, int]:
            if t.name == "numeric":
                if t.precision is None:
                    raise self.untranslatable("numeric without a precision", node,
                                              "declare the column numeric(p,s) with p <= 38")
                return t.precision, t.scale or 0
            return {"int2": 5, "int4": 10, "int8": 19}[t.name], 0
        (p1, s1), (p2, s2) = ps(lt), ps(rt)
        if op in "+-":
            scale = max(s1, s2)
            precision = max(p1 - s1, p2 - s2) + scale + 1
        elif op == "*":
            scale, precision = s1 + s2, p1 + p2 + 1
        else:  # %
            scale = max(s1, s2)
            precision = min(p1 - s1, p2 - s2) + scale
        if precision > T.SPARK_MAX_DECIMAL_PRECISION:
            raise self.untranslatable(
                f"numeric arithmetic needing {precision} digits", node,
                "Spark's decimal holds 38 digits; use narrower numeric(p,s) columns or compare without arithmetic")
        return PgType("numeric", precision, scale)

    def _a_Add(self, node): return self._arith(node, "+")
    def _a_Sub(self, node): return self._arith(node, "-")
    def _a_Mul(self, node): return self._arith(node, "*")
    def _a_Mod(self, node): return self._arith(node, "%")

    def _a_Div(self, node: exp.Div) -> PgType:
        return self._arith(node, "/")

    def _a_Neg(self, node: exp.Neg) -> PgType:
        t = self.analyze(node.this)
        # The parser folds a minus sign into a numeric literal (gram.y doNegate); anything else, even
        # a typed constant such as '-32768'::smallint, is negated by the type's operator when the
        # filter runs (int2um raises "smallint out of range" there).
        if isinstance(node.this, exp.Literal) and not node.this.is_string:
            constant = self.constants[id(node.this)]
            assert isinstance(constant, (int, decimal.Decimal)), constant  # what _a_Literal keeps of a number
            value = -constant
            self.constants[id(node)] = value
            if isinstance(value, int):
                return T.integer_literal_type(value)
            return t
        if not t.is_numeric_family:
            raise self.error(f"operator does not exist: - {t}", node)
        return t

    def _a_DPipe(self, node: exp.DPipe) -> PgType:
        lt, rt = self.analyze(node.left), self.analyze(node.right)
        for child, t in ((node.left, lt), (node.right, rt)):
            if not (t.is_text_family or t.is_unknown):
                # anynonarray || text is textanycat, STABLE because of the output function
                self.walker_violation(MUTABLE, node)
            self.coerce(child, t, T.TEXT)
        self.collations[id(node)] = self.collations.get(id(node.left)) or self.collations.get(id(node.right))
        return T.TEXT

    def _a_Like(self, node: exp.Like) -> PgType:
        return self._pattern(node, "LIKE")

    def _a_ILike(self, node: exp.ILike) -> PgType:
        return self._pattern(node, "ILIKE")

    def _a_SimilarTo(self, node: exp.SimilarTo) -> PgType:
        return self._pattern(node, "SIMILAR TO")

    def _a_Escape(self, node: exp.Escape) -> PgType:
        self.analyze(node.this)
        t = self.analyze(node.expression)
        self.coerce(node.expression, t, T.TEXT)
        if isinstance(node.this, exp.SimilarTo):
            self.check_regex(node)
        return T.BOOL

    def _pattern(self, node: exp.Binary, op: str) -> PgType:
        quantified = quantified_array(node.right)
        if quantified is not None:  # LIKE / ILIKE ANY|ALL (…): subquery_Op in gram.y (SIMILAR TO has none)
            return self.quantified_pattern(node, op, *quantified)
        lt, rt = self.analyze(node.left), self.analyze(node.right)
        for child, t in ((node.left, lt), (node.right, rt)):
            if not (t.is_text_family or t.is_unknown):
                raise self.error(f"operator does not exist: {lt} ~~ {rt}", node)
            if child is node.left and t.name == "bpchar":
                continue  # bpcharlike(character, text) matches the padded value, trailing spaces included
            self.coerce(child, t, T.TEXT)
        if op == "ILIKE":
            self._require_binary_collation(node, "ILIKE", node.left, node.right)
        if op == "SIMILAR TO" and not isinstance(node.parent, exp.Escape):
            self.check_regex(node)  # with ESCAPE, _a_Escape checks it with its escape character
        return T.BOOL

    def _require_binary_collation(self, node: exp.Expr, what: str, *operands: exp.Expr,
                                  fix: str = 'case mapping depends on the collation; add COLLATE "C" (ASCII case '
                                  'mapping, which is exact in Spark) to the column in the filter') -> None:
        """Refuse ``what`` when an operand has a collation whose order or case mapping Spark does not share."""
        for o in operands:
            coll = self.collations.get(id(o))
            if coll is not None and coll not in T.BINARY_ORDER_COLLATIONS:
                raise self.untranslatable(f'{what} under collation "{coll}"', node, fix)

    def _a_Collate(self, node: exp.Collate) -> PgType:
        t = self.analyze(node.this)
        name = node.expression.name if isinstance(node.expression, (exp.Identifier, exp.Column, exp.Var)) \
            else node.expression.sql()
        funcs = self.context.functions
        if name in funcs.user_defined_collations:
            self.walker_violation(USER_COLLATION, node)
        elif funcs.builtin_collations and name not in funcs.builtin_collations:
            raise self.error(f'collation "{name}" for encoding "UTF8" does not exist', node)
        if not (t.is_text_family or t.is_unknown):
            raise self.error(f"collations are not supported by type {t}", node)
        self.collations[id(node)] = name
        if t.is_unknown:
            self.coerce(node.this, t, T.TEXT)
            return T.TEXT
        return t

    # --- conditional expressions ------------------------------------------------------------------
    def _common_of(self, node: exp.Expr, parts: list[exp.Expr], construct: str) -> PgType:
        types = [self.analyze(p) for p in parts]
        common = T.UNKNOWN
        for t in types:
            if common.is_unknown:
                common = t
            elif not t.is_unknown and t != common:
                # select_common_type: switch to a later type only when the earlier one converts to
                # it implicitly and not back. Numbers climb int2 < int4 < int8 < numeric < float4
                # < float8 (COALESCE(real, numeric) is real); the string types all convert both
                # ways, so the first one stays (COALESCE(c, t) is character).
                resolved = T.numeric_common(common, t)
                if resolved is not None:
                    order = ("int2", "int4", "int8", "numeric", "float4", "float8")
                    top = max(common, t, key=lambda x: order.index(x.name))
                    common = self._numeric_result(common, t) if top.name == "numeric" else PgType(top.name)
                elif common.is_text_family and t.is_text_family:
                    common = PgType(common.name) if common.name != t.name or common.precision != t.precision \
                        else common
                elif {common.name, t.name} == {"date", "timestamp"}:
                    common = T.TIMESTAMP
                else:
                    raise self.error(f"{construct} types {common} and {t} cannot be matched", node)
        if common.is_unknown:
            common = T.TEXT
        for p, t in zip(parts, types, strict=True):
            self.coerce(p, t, common)
        colls = [self.collations.get(id(p)) for p in parts if self.collations.get(id(p))]
        self.collations[id(node)] = colls[0] if colls else None
        return common

    def _a_Coalesce(self, node: exp.Coalesce) -> PgType:
        return self._common_of(node, [node.this, *node.expressions], "COALESCE")

    def _a_Greatest(self, node: exp.Greatest) -> PgType:
        parts = [node.this, *node.expressions]
        common = self._common_of(node, parts, "GREATEST")
        self._check_comparable(common, node, "<", *parts)
        return common

    def _a_Least(self, node: exp.Least) -> PgType:
        parts = [node.this, *node.expressions]
        common = self._common_of(node, parts, "LEAST")
        self._check_comparable(common, node, "<", *parts)
        return common

    def _a_Nullif(self, node: exp.Nullif) -> PgType:
        lt = self.analyze(node.this)
        rt = self.analyze(node.expression)
        common = self.common_type(lt, rt, "=", node)
        self.coerce(node.this, lt, common)
        self.coerce(node.expression, rt, common)
        self._inherit(node, node.this)
        # NULLIF returns the first argument of its = operator (transformNullIf, parse_expr.c): a cross-type
        # operator of the same family (int24eq, float48eq, date_eq_timestamp …) takes it unconverted, so
        # NULLIF(i2, i4) is a smallint (and i2 * i2 of it overflows as smallint); otherwise the converted value.
        if any(lt.name in family and rt.name in family for family in _CROSS_TYPE_EQUALITY):
            return lt
        return common

    def _a_Case(self, node: exp.Case) -> PgType:
        subject = node.this
        if subject is not None:
            st = self.analyze(subject)
            for branch in node.args["ifs"]:
                wt = self.analyze(branch.this)
                common = self.common_type(st, wt, "=", branch)
                self.coerce(branch.this, wt, common)
                self.targets.setdefault(id(subject), common)
                self._check_comparable(common, branch, "=", subject, branch.this)
        else:
            for branch in node.args["ifs"]:
                t = self.analyze(branch.this)
                if t.name != "bool" and not t.is_unknown:
                    raise self.error(f"argument of CASE/WHEN must be type boolean, not type {t}", branch.this)
                self.coerce(branch.this, t, T.BOOL)
        results = [b.args["true"] for b in node.args["ifs"]]
        if node.args.get("default") is not None:
            results.insert(0, node.args["default"])  # transformCaseExpr puts ELSE first
        return self._common_of(node, results, "CASE")

    # --- casts ------------------------------------------------------------------------------------
    def _a_Cast(self, node: exp.Cast) -> PgType:
        target = T.parse_type(node.to.sql(dialect="postgres"))
        if target.name in ("int", "integer"):
            target = T.INT4
        source = self.analyze(node.this)
        if id(node.this) in self.constants and source.is_unknown:
            # PostgreSQL folds a cast of a string literal (or NULL) into a typed constant at parse
            # time with the type's input function. A cast of a typed constant (32768::int2,
            # 2.5::integer) is a cast function PostgreSQL runs when the filter is evaluated.
            value = self.literal_value(node.this, self.constants[id(node.this)], target)
            self.constants[id(node)] = value
            if target.name == "numeric" and target.precision is None and isinstance(value, (int, decimal.Decimal)):
                target = decimal_type(decimal.Decimal(value))  # a constant's own digits suffice
            self._require_spark_type(target, node)
            return target
        if source == target or (source.name, target.name) in _BINARY_CAST:
            return target
        if source.is_text_family and target.is_text_family:
            return target  # binary-coercible or rtrim(), plus the immutable length coercion
        pair = (source.name, target.name)
        if pair in _STABLE_CASTS:
            self.walker_violation(MUTABLE, node)
        elif source.is_numeric_family and target.is_numeric_family:
            if source.name in ("float4", "float8") and target.name == "numeric":
                raise self.untranslatable(
                    "a cast from double precision to numeric", node,
                    "PostgreSQL keeps 15 significant digits there and Spark keeps all; compare as double precision")
            if target.name == "numeric" and target.precision is None and (source.is_integer or source.name == "numeric"):
                # integer -> numeric (what pg_get_expr shows as (50)::numeric) keeps the value exactly
                target = source if source.name == "numeric" else PgType(
                    "numeric", {"int2": 5, "int4": 10, "int8": 19}[source.name], 0)
            self._require_spark_type(target, node)
        elif pair in _IMMUTABLE_FUNCTION_CASTS:
            pass
        elif target.is_text_family or source.is_text_family or source.name in ("json", "jsonb", "uuid"):
            self.walker_violation(ONLY_SIMPLE, node)  # CoerceViaIO
        else:
            raise self.error(f"cannot cast type {source} to {target}", node)
        return target

    def literal_value(self, node: exp.Expr, value: object, target: PgType) -> object:
        """Convert a constant to ``target`` as PostgreSQL's input function would, or raise its error."""
        try:
            return constant_value(value, target, self.context.timezone)
        except InvalidConstant as e:
            raise self.error(str(e), node) from None
        except UnrepresentableConstant as e:
            raise self.untranslatable(e.what, node, e.fix) from None

    # --- functions --------------------------------------------------------------------------------
    def _function(self, node: exp.Func) -> PgType:
        name = function_name(node)
        if not name:  # an operator sqlglot represents as a function (a @> b, j -> 'k' …)
            raise self.untranslatable(f"the operator in {node.sql(dialect='postgres')!r}", node,
                                      "rewrite the filter with the operators listed in docs/row-filters.md")
        if name == "row":
            return self._a_Tuple(node)
        args = [a for a in node.iter_expressions()]
        if name in AGGREGATES:
            raise self.error("aggregate functions are not allowed in WHERE", node)
        if name in WINDOW_FUNCTIONS:
            raise self.error("window functions are not allowed in WHERE", node)
        if name in SET_RETURNING:
            raise self.error("set-returning functions are not allowed in WHERE", node)
        types = [self.analyze(a) for a in args]
        handler = getattr(self, f"_f_{name}", None)
        kind = self.context.functions.classify(name)
        if kind == "missing" and handler is None:
            signature = ", ".join(str(t) for t in types)
            raise self.error(f"function {name}({signature}) does not exist", node,
                             hint="No function matches the given name and argument types. "
                             "You might need to add explicit type casts.")
        if name in SQL_VALUE_FUNCTIONS and not args:
            self.walker_violation(ONLY_SIMPLE, node)
            return ANY
        if kind in ("user", "mutable"):
            self.walker_violation(MUTABLE, node)
            return ANY if handler is None else handler(node, args, types)
        if handler is None:
            raise self.untranslatable(f"function {name}()", node,
                                      "use the functions listed in docs/row-filters.md")
        return handler(node, args, types)

    def _expect(self, node, args, types, n: int, name: str) -> None:
        if len(args) != n:
            sig = ", ".join(str(t) for t in types)
            raise self.error(f"function {name}({sig}) does not exist", node)

    def _text_fn(self, node, args, types, name: str) -> PgType:
        self._expect(node, args, types, 1, name)
        if not (types[0].is_text_family or types[0].is_unknown):
            raise self.error(f"function {name}({types[0]}) does not exist", node)
        self.coerce(args[0], types[0], T.TEXT)
        self._inherit(node, args[0])
        if name in ("lower", "upper"):
            self._require_binary_collation(node, f"{name}()", args[0])
        return T.TEXT

    def _f_lower(self, node, args, types): return self._text_fn(node, args, types, "lower")
    def _f_upper(self, node, args, types): return self._text_fn(node, args, types, "upper")
    def _f_btrim(self, node, args, types): return self._text_fn(node, args, types, "btrim")
    def _f_ltrim(self, node, args, types): return self._text_fn(node, args, types, "ltrim")
    def _f_rtrim(self, node, args, types): return self._text_fn(node, args, types, "rtrim")

    def _f_length(self, node, args, types) -> PgType:
        self._expect(node, args, types, 1, "length")
        t = types[0]
        if not (t.is_text_family or t.is_unknown):
            raise self.error(f"function length({t}) does not exist", node)
        if t.is_unknown:
            self.coerce(args[0], t, T.TEXT)
        return T.INT4

    def _f_abs(self, node, args, types) -> PgType:
        self._expect(node, args, types, 1, "abs")
        if not types[0].is_numeric_family:
            raise self.error(f"function abs({types[0]}) does not exist", node)
        return types[0]

    def _f_mod(self, node, args, types) -> PgType:
        return self._arith(node, "%")

    def _f_starts_with(self, node, args, types) -> PgType:
        self._expect(node, args, types, 2, "starts_with")
        for a, t in zip(args, types, strict=True):
            if not (t.is_text_family or t.is_unknown):
                raise self.error(f"function starts_with({types[0]}, {types[1]}) does not exist", node)
            self.coerce(a, t, T.TEXT)
        return T.BOOL

    def _f_round(self, node, args, types) -> PgType:
        t = types[0]
        if len(args) == 1 and (t.name in ("float8", "float4") or t.is_integer):
            # round(integer) resolves to round(double precision): float8 is the preferred type of
            # the numeric category, so PostgreSQL prefers it over round(numeric).
            self.coerce(args[0], t, T.FLOAT8)
            return T.FLOAT8
        if t.is_integer or t.is_unknown:
            t = PgType("numeric", {"int2": 5, "int4": 10, "int8": 19}.get(t.name, 10), 0)
            self.coerce(args[0], types[0], t)
        if t.name != "numeric":
            raise self.error(f"function round({', '.join(map(str, types))}) does not exist", node)
        if len(args) == 2:
            digits = self.constants.get(id(args[1]))
            if not isinstance(digits, int):
                raise self.untranslatable("round() with a non-constant number of digits", node,
                                          "use a constant, e.g. round(amount, 2)")
            if t.precision is None:
                raise self.untranslatable("numeric without a precision", node, "declare numeric(p,s)")
            return PgType("numeric", min(t.precision + 1, T.SPARK_MAX_DECIMAL_PRECISION), max(digits, 0))
        if t.precision is None:
            raise self.untranslatable("numeric without a precision", node, "declare numeric(p,s)")
        return PgType("numeric", min(t.precision - (t.scale or 0) + 1, T.SPARK_MAX_DECIMAL_PRECISION), 0)

    def _f_replace(self, node, args, types) -> PgType:
        self._expect(node, args, types, 3, "replace")
        for a, t in zip(args, types, strict=True):
            if not (t.is_text_family or t.is_unknown):
                raise self.error(f"function replace({', '.join(map(str, types))}) does not exist", node)
            self.coerce(a, t, T.TEXT)
        self._inherit(node, args[0])
        return T.TEXT

    def _a_Any(self, node: exp.Any) -> PgType:
        raise self.untranslatable("ANY (…) outside a comparison with ARRAY[…]", node,
                                  "compare with = ANY (ARRAY[…]) or write the values as IN (…)")


def in_list_groups(node: exp.In) -> tuple[list[exp.Expr], list[exp.Expr]]:
    """Split ``x IN (…)`` the way PostgreSQL's transformAExprIn does.

    With more than one item that references no column, those items become one
    ``x = ANY (ARRAY[…])`` in their common type with ``x``; every other item (all of them when
    at most one is column-free) is compared as ``x = item`` with its own operator, ORed in list
    order after the array. So ``i8 IN (f8, 9223372036854775806)`` compares i8 exactly with the
    literal, not as double precision.
    """
    items = list(node.expressions)
    free = [e for e in items if not any(isinstance(n, exp.Column) for n in e.walk())]
    if len(free) > 1:
        return free, [e for e in items if not any(e is f for f in free)]
    return [], items


def _prefix_rank(node: exp.Expr) -> int:
    """Position of ``node`` in a prefix walk of its whole tree (PostgreSQL's walker order)."""
    root = node
    while root.parent is not None:
        root = root.parent
    for rank, n in enumerate(root.walk(bfs=False)):
        if n is node:
            return rank
    return 1 << 59
