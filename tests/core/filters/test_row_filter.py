"""The row-filter analyser (core/filters/row_filter.py) on inline cases: what it accepts, with which types, and
what it refuses with PostgreSQL's message.

Through the public functions only (``parse_row_filter``, ``validate_row_filter``). The messages are
PostgreSQL's (``check_simple_rowfilter_expr_walker`` and ``transformPubWhereClauses`` in
src/backend/commands/publicationcmds.c, ``transformColumnRef`` in parse_relation.c); the
differential tests (test_row_filter_differential.py) hold the analyser against a live server.
"""

from __future__ import annotations

import re

import pytest
from sqlglot import exp

from airflow_provider_rowfilter.core.errors import InvalidRowFilterError, PublicationSyntaxError
from airflow_provider_rowfilter.core.filters.row_filter import parse_row_filter, validate_row_filter
from airflow_provider_rowfilter.core.relation import Column, Relation, RelKind, TableName

RELATION = Relation(TableName("public", "t"), 16384, RelKind.TABLE,
                    (Column("id", 1, "integer", 23), Column("b", 2, "text", 25, collation="default"),
                     Column("n", 3, "numeric(10,2)", 1700)), identity_columns=("id",))

# filter -> (the type of each node kind in the tree, the columns it reads)
ACCEPTED = {
    "id > 1": ({"GT": "boolean", "Column": "integer", "Literal": "integer"}, ["id"]),
    "b || 'x' = 'yx'": ({"EQ": "boolean", "DPipe": "text", "Column": "text", "Literal": "unknown"}, ["b"]),
    "n > 1.5": ({"GT": "boolean", "Column": "numeric", "Literal": "numeric"}, ["n"]),
    "id + 1 > 2": ({"GT": "boolean", "Add": "integer", "Column": "integer", "Literal": "integer"}, ["id"]),
    "b IS NULL": ({"Is": "boolean", "Column": "text"}, ["b"]),
    "id IN (1, 2)": ({"In": "boolean", "Column": "integer", "Literal": "integer"}, ["id"]),
}


@pytest.mark.parametrize(("sql", "types", "columns"), [(k, *v) for k, v in ACCEPTED.items()], ids=ACCEPTED.keys())
def test_accepted_filters_are_typed(sql, types, columns):
    result = validate_row_filter(sql, RELATION)
    assert str(result.type_of(result.tree)) == "boolean"
    typed = {type(node).__name__: str(result.type_of(node)) for node in result.tree.walk() if id(node) in result.types}
    assert typed == types
    assert sorted(result.columns) == columns


REFUSED = {
    "mutable-function": ("random() > 0.5", "invalid publication WHERE expression",
                         "User-defined or built-in mutable functions are not allowed."),
    "not-boolean": ("id", "argument of PUBLICATION WHERE must be type boolean, not type integer", None),
    "unknown-column": ("nosuch > 1", 'column "nosuch" does not exist', None),
    "system-column": ("ctid = '(0,1)'", "invalid publication WHERE expression", "System columns are not allowed."),
}


@pytest.mark.parametrize(("sql", "message", "detail"), REFUSED.values(), ids=REFUSED.keys())
def test_refused_filters_raise_postgresqls_error(sql, message, detail):
    with pytest.raises(InvalidRowFilterError) as raised:
        validate_row_filter(sql, RELATION)
    assert str(raised.value).splitlines()[0] == message
    assert raised.value.detail == detail


@pytest.mark.parametrize("sql", ["id = 1 = true", "id >", "id > 1 )"], ids=["nonassociative", "cut", "stray"])
def test_syntax_errors(sql):
    with pytest.raises(PublicationSyntaxError, match="^syntax error"):
        parse_row_filter(sql)


def test_parse_gives_one_tree_and_validate_reuses_it():
    tree = parse_row_filter("id > 1 AND b <> 'x'")
    assert isinstance(tree, exp.And)
    assert validate_row_filter("id > 1 AND b <> 'x'", RELATION, tree=tree).columns == frozenset({"id", "b"})


UNCONSTRAINED = Relation(TableName("public", "t"), 16384, RelKind.TABLE,
                         (Column("id", 1, "integer", 23), Column("amount", 2, "numeric", 1700)), identity_columns=("id",))


@pytest.mark.parametrize("sql", ["amount::numeric(20,2) > 100", "amount IS NULL", "amount > 1"])
def test_numeric_column_without_precision_is_refused_at_validation(sql):
    """The apply reads each filter column as its Spark type, and a numeric without a precision has none
    (core/apply/plan.py ``filter_expression``): a filter the refresh accepted failed at the first apply."""
    from airflow_provider_rowfilter.core.apply.plan import filter_expression
    from airflow_provider_rowfilter.core.errors import UntranslatableFilterError

    with pytest.raises(UntranslatableFilterError, match='the column "amount" of type numeric without a precision') as raised:
        validate_row_filter(sql, UNCONSTRAINED)
    assert "numeric(p,s)" in raised.value.hint
    with pytest.raises(UntranslatableFilterError):  # why: the apply cannot read the column
        filter_expression(exp.column("amount"), {"amount": "numeric"}, lambda name: exp.column(name))


@pytest.mark.parametrize("sql", ["b ILIKE 'a%' COLLATE \"en_US\"", "b COLLATE \"en_US\" ILIKE 'a%'",
                                 "b ILIKE ANY (ARRAY['a%' COLLATE \"en_US\"])"],
                         ids=["pattern", "subject", "array-element"])
def test_ilike_under_a_linguistic_collation_is_refused_whichever_side_names_it(sql):
    """ILIKE folds case by its input collation, which either operand may name (the pattern's COLLATE too);
    Spark folds ASCII only, which is exact under C and POSIX alone."""
    from airflow_provider_rowfilter.core.errors import UntranslatableFilterError

    with pytest.raises(UntranslatableFilterError, match='ILIKE under collation "en_US"'):
        validate_row_filter(sql, RELATION)


XML_RELATION = Relation(TableName("public", "docs"), 16384, RelKind.TABLE,
                        (Column("id", 1, "integer", 23), Column("body", 2, "xml", 142)), identity_columns=("id",))


@pytest.mark.parametrize("mechanisms", ["", "BY VALUE ", "BY REF "])
@pytest.mark.parametrize("after", ["", " BY VALUE", " BY REF"])
def test_xmlexists_is_the_call_gram_y_makes_of_it_and_refused_for_spark_with_the_reason(mechanisms, after):
    """gram.y: ``XMLEXISTS '(' c_expr PASSING [mech] c_expr [mech] ')'`` is ``xmlexists(text, xml)``; PostgreSQL
    accepts it in a filter (tests/core/fixtures/publication_cases.yaml rf-xmlexists*, replayed on PostgreSQL 18)
    and its publisher evaluates it (filtering: source); Spark cannot, as no XML function."""
    from airflow_provider_rowfilter.core.errors import UntranslatableFilterError
    from airflow_provider_rowfilter.core.filters.row_filter import evaluated_by_publisher

    sql = f"id > 0 AND xmlexists('//x[@k=1]' PASSING {mechanisms}body{after})"
    call = parse_row_filter(sql).find(exp.Anonymous)
    assert call is not None and call.name == "xmlexists"
    assert [a.sql("postgres") for a in call.expressions] == ["'//x[@k=1]'", "body"]
    with pytest.raises(UntranslatableFilterError, match=r"function xmlexists\(\) cannot be evaluated by Spark") as e:
        validate_row_filter(sql, XML_RELATION)
    assert e.value.position == sql.index("xmlexists") + 1
    assert evaluated_by_publisher(sql, XML_RELATION, e.value.message).columns == {"id", "body"}


@pytest.mark.parametrize(("sql", "near"), [
    ("xmlexists('//x'::text PASSING body)", "::"),  # c_expr: no cast outside parentheses
    ("xmlexists('//' || 'x' PASSING body)", "||"),
    ("xmlexists('//x', body)", ","),
    ("xmlexists('//x' PASSING BY body)", "body"),
    ("xmlexists('//x' PASSING body BY VALUE BY REF)", "BY"),
])
def test_xmlexists_syntax_errors_are_postgresqls(sql, near):
    with pytest.raises(PublicationSyntaxError, match=f'syntax error at or near "{re.escape(near)}"'):
        parse_row_filter(sql)
