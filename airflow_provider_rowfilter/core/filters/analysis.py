"""Row filters, semantics: type one parsed filter and check it as PostgreSQL's parse analysis does.

Two passes mirror PostgreSQL: parse analysis (``transformWhereClause``: names, types, operators,
aggregates) raises first; then the restrictions of ``check_simple_rowfilter_expr_walker``
(publicationcmds.c) are checked in prefix order and the first violation is raised with
PostgreSQL's text. :func:`analyze` returns the type of every node, the type its parent coerces it
to, its collation and, for constants, their value: what core/filters/spark_translation.py reads, so both
share one notion of each node's type. The syntax is core/filters/grammar.py's, constant values
core/filters/constants.py's. This module holds the entry, names, constants and boolean logic; the
analyzer's other handlers are mixins, one module per concept: the comparisons, BETWEEN and IN
(analysis_comparisons.py), arithmetic, patterns and COLLATE (analysis_operators.py), common types and
casts (analysis_coercion.py), function calls (analysis_functions.py), the string functions, regular
expressions, ANY/ALL and row tests (text.py).
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
from airflow_provider_rowfilter.core.filters.analysis_coercion import CoercionAnalysis
from airflow_provider_rowfilter.core.filters.analysis_comparisons import ComparisonAnalysis
from airflow_provider_rowfilter.core.filters.analysis_functions import FunctionAnalysis
from airflow_provider_rowfilter.core.filters.analysis_operators import OperatorAnalysis
from airflow_provider_rowfilter.core.filters.constants import (
    InvalidConstant,
    NumericFieldOverflow,
    decimal_type,
    numeric_typmod,
    unicode_escapes,
)
from airflow_provider_rowfilter.core.filters.dialect import identifier_name
from airflow_provider_rowfilter.core.filters.functions import FunctionCatalog
from airflow_provider_rowfilter.core.filters.grammar import (
    INVALID,
    ONLY_SIMPLE,
    SYSTEM_COLUMN,
    USER_TYPE,
    node_position,
)
from airflow_provider_rowfilter.core.filters.pg_types import ANY, PgType
from airflow_provider_rowfilter.core.filters.text import TextAnalysis, row_fields
from airflow_provider_rowfilter.core.relation import SYSTEM_COLUMNS, Relation


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



class _Analyzer(ComparisonAnalysis, TextAnalysis, OperatorAnalysis, CoercionAnalysis, FunctionAnalysis):
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
            # An implicit coercion of a literal ignores varchar(n)/character(n) lengths and numeric(p,s)'s typmod
            # (PostgreSQL coerces to the bare type; only an explicit cast or an assignment applies it).
            bare = PgType(wanted.name) if wanted.is_text_family or wanted.name == "numeric" else wanted
            value = self.literal_value(node, self.constants[id(node)], bare)
            if wanted.name == "numeric" and wanted.precision is not None:
                self.require_exact_numeric(value, wanted, node)
            self.constants[id(node)] = value

    def require_exact_numeric(self, value: object, t: PgType, node: exp.Expr) -> None:
        """Refuse a literal the operator compares digit for digit (numeric_cmp) that the Spark type ``t``, the
        numeric(p,s) the comparison is computed in here, would round or overflow (``n = '1.2345'`` for a
        numeric(12,3) ``n`` is false for every row). NaN and the infinities fit any (core/filters/spark_numeric.py)."""
        assert t.precision is not None
        if not isinstance(value, decimal.Decimal) or not value.is_finite():
            return
        try:
            exact = numeric_typmod(value, t.precision, t.scale or 0) == value
        except NumericFieldOverflow:
            exact = False
        if not exact:
            raise self.untranslatable(
                f"the numeric literal {format(value, 'f')} compared as numeric({t.precision},{t.scale or 0})", node,
                "write the literal within the column's precision and scale, or cast the column in the filter to a "
                "numeric(p,s) that holds the literal (e.g. n::numeric(13,4) < '1.2345')")

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

    def _a_UnicodeString(self, node: exp.Expr) -> PgType:
        """``U&'…'`` [``UESCAPE 'c'``]: an unknown-type literal whose escapes are decoded as parser.c
        ``str_udeescape`` does (core/filters/constants.py ``unicode_escapes``), with its errors."""
        escape = node.args.get("escape")
        char = escape.this if isinstance(escape, exp.Literal) else "\\"
        try:
            self.constants[id(node)] = unicode_escapes(node.this, char)
        except InvalidConstant as e:
            raise self.error(e.args[0], node, hint=e.args[1] if len(e.args) > 1 else None) from None
        return T.UNKNOWN

    def _a_RawString(self, node: exp.Expr) -> PgType:
        """``$$…$$`` / ``$tag$…$tag$``: an unknown-type literal whose body is taken as written (scan.l xdolq)."""
        self.constants[id(node)] = node.this
        return T.UNKNOWN

    def _a_Parameter(self, node: exp.Expr) -> PgType:
        """``$1``: a filter has no parameters (parse_param.c ``variable_paramref_hook`` is not set)."""
        raise self.error(f"there is no parameter ${node.name}", node)

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


def _prefix_rank(node: exp.Expr) -> int:
    """Position of ``node`` in a prefix walk of its whole tree (PostgreSQL's walker order)."""
    root = node
    while root.parent is not None:
        root = root.parent
    for rank, n in enumerate(root.walk(bfs=False)):
        if n is node:
            return rank
    return 1 << 59
