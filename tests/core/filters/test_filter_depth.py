"""How deep and how long a row filter may be (core/filters/stack_depth.py): the review of issue 42, item 4.

Found: filters nested 50 parentheses deep, ``NOT`` 3,000 times, or a 20,000-term ``OR`` chain ended in a
RecursionError, and ``id IN (0, …, 99999)`` ran for minutes (each item was compared with every other). PostgreSQL 18
takes ~10,000 parentheses, ~8,700 ``NOT`` and any length of ``OR`` under its default ``max_stack_depth``.
"""

from __future__ import annotations

import sys
import time

import pytest
from sqlglot import exp

from airflow_provider_rowfilter.core.errors import PublicationSyntaxError
from airflow_provider_rowfilter.core.filters import stack_depth
from airflow_provider_rowfilter.core.filters.grammar import parse_row_filter
from airflow_provider_rowfilter.core.filters.row_filter import validate_row_filter
from airflow_provider_rowfilter.core.filters.spark_translation import to_spark_sql
from airflow_provider_rowfilter.core.filters.stack_depth import MAX_DEPTH, depth, flattened
from tests.core.filters import filter_table as ft


def _nested(kind: str, n: int) -> str:
    return {"paren": "(" * n + "i4 > 1" + ")" * n, "not": "NOT " * n + "i4 > 1",
            "minus": "i4 = " + "- " * n + "1", "coalesce": "i4 = " + "coalesce(" * n + "1" + ")" * n,
            "plus": "i4 = " + "(" * n + "1" + " + 1)" * n}[kind]


def _deepest(kind: str) -> int:
    """The largest nesting of ``kind`` whose tree is at most MAX_DEPTH deep."""
    measured = stack_depth.deep_stack(lambda n: depth(flattened(parse_row_filter(_nested(kind, n)))))
    n = 1
    while measured(n + 1) <= MAX_DEPTH:
        n += 1
    return n


@pytest.mark.parametrize("kind", ["paren", "not", "minus", "coalesce", "plus"])
def test_a_filter_nested_to_the_limit_passes_every_step_and_one_level_more_gets_postgresql_s_error(kind):
    n = _deepest(kind)
    assert n >= 30, n  # every kind nests at least 30 levels (parentheses alone: ~95)
    row_filter = validate_row_filter(_nested(kind, n), ft.RELATION)
    # Everything after the parse runs on an ordinary stack: from one already 300 calls deep, the translation,
    # the document a refresh records and the apply's Spark expression of it.
    assert _at_depth(300, lambda: (to_spark_sql(row_filter), ft.apply_filter_text(ft.recorded_rules(row_filter))))
    with pytest.raises(PublicationSyntaxError) as refused:
        validate_row_filter(_nested(kind, n + 1), ft.RELATION)
    assert refused.value.message == "stack depth limit exceeded"  # PostgreSQL's words (check_stack_depth)
    assert f"at most {MAX_DEPTH} levels" in str(refused.value) and "HINT:" in str(refused.value)


@pytest.mark.parametrize("text", ["NOT " * 3000 + "i4 > 1", "(" * 3000 + "i4 > 1" + ")" * 3000,
                                  "i4 = " + "coalesce(" * 5000 + "1" + ")" * 5000])
def test_a_filter_nested_thousands_deep_is_refused_with_postgresql_s_error_in_bounded_time(text):
    began = time.monotonic()
    with pytest.raises(PublicationSyntaxError, match="stack depth limit exceeded"):
        validate_row_filter(text, ft.RELATION)
    assert time.monotonic() - began < 30
    assert sys.getrecursionlimit() < stack_depth.RECURSION_LIMIT  # put back after the parse


@pytest.mark.parametrize("connector", ["OR", "AND"])
def test_a_long_chain_is_accepted_flattened_in_its_order(connector):
    terms = [f"i4 = {i}" if connector == "OR" else f"i4 <> {i}" for i in range(5_000)]
    row_filter = validate_row_filter(f" {connector} ".join(terms), ft.RELATION)
    assert depth(row_filter.tree) < 25
    kind = exp.Or if connector == "OR" else exp.And
    leaves = [n for n in row_filter.tree.walk(bfs=False) if isinstance(n, (exp.EQ, exp.NEQ))]
    assert [int(n.expression.name) for n in leaves] == list(range(5_000))  # same operands, same order
    assert all(isinstance(n.parent, kind) for n in leaves)
    assert row_filter.tree.sql("postgres") == f" {connector} ".join(terms)  # written back as it was
    assert to_spark_sql(row_filter).count(f" {connector} ") == 4_999


def test_a_short_chain_keeps_sqlglot_s_shape():
    tree = parse_row_filter("i4 = 1 OR i4 = 2 OR i4 = 3")
    assert flattened(tree) is tree and isinstance(tree.this, exp.Or)


def test_an_in_list_is_read_in_linear_time():
    def seconds(n: int) -> float:
        began = time.monotonic()
        validate_row_filter("i4 IN (" + ", ".join(map(str, range(n))) + ")", ft.RELATION)
        return time.monotonic() - began

    small, large = seconds(5_000), seconds(50_000)
    assert large < 20 * small + 3, (small, large)  # was quadratic: 100,000 items ran for minutes


def test_the_parse_sees_the_callers_context_variables():
    from airflow_provider_rowfilter.core.publication.ddl import _DEFER_FILTER_ERRORS, table_refusals

    seen = []
    probe = stack_depth.deep_stack(lambda: seen.append(_DEFER_FILTER_ERRORS.get()))
    with table_refusals():
        probe()
    probe()
    assert seen == [True, False]


def _at_depth(calls: int, fn):
    return fn() if calls == 0 else _at_depth(calls - 1, fn)
