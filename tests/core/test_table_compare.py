"""core/compare/table_compare.py: buckets, their predicates, and the matching of the rows of differing buckets."""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.compare.table_compare import (
    EXAMPLES,
    HashBuckets,
    Hashing,
    RangeBuckets,
    add_sums,
    compare_shape,
    diff_keyed,
    diff_multiset,
    differing_buckets,
    groups,
    runs,
)
from airflow_provider_rowfilter.core.relation import TableName

T = TableName("public", "t")


def test_ranges_of_an_integer_key_cover_every_value_once():
    buckets = RangeBuckets.spanning("id", 1, 1000, rows=10_000)
    assert (buckets.lower, buckets.stride, buckets.count) == (1, 334, 3)
    assert buckets.predicate([0]) == '(("id" < 335 OR "id" IS NULL))'
    assert buckets.predicate([1, 2]) == '(("id" >= 335))'  # consecutive buckets merged, the last open-ended
    assert buckets.predicate([0, 2]) == '(("id" < 335 OR "id" IS NULL) OR ("id" >= 669))'
    assert buckets.predicate([0, 1, 2]) == "((TRUE))"
    assert buckets.predicate([]) == "FALSE"
    assert "div(" in RangeBuckets("id", -(1 << 63), 1 << 60, 16).bucket_sql()  # past a bigint: numeric


def test_hashed_buckets_of_a_key():
    buckets = HashBuckets(("k",), Hashing.RECORD, 8)
    assert buckets.bucket_sql("t") == '((hash_record_extended(ROW(t."k"), 1) & 2147483647) % 8)::int4'
    assert buckets.predicate([3, 1]) == ('((hash_record_extended(ROW("k"), 1) & 2147483647) % 8)::int4 '
                                         "= ANY ('{1,3}'::int4[])")
    assert buckets.predicate(range(8)) == "TRUE"
    assert "md5(ROW(\"k\")::text)" in HashBuckets(("k",), Hashing.TEXT, 8).bucket_sql()


def test_a_qualified_range():
    assert RangeBuckets("id", 0, 10, 2).predicate([1], "t") == '((t."id" >= 10))'


@pytest.mark.parametrize(("pub", "sub", "record", "key", "integer", "hashing"), [
    ({"id": "integer", "v": "text"}, {"id": "bigint", "v": "text"}, True, ("id",), True, Hashing.TEXT),
    ({"id": "integer", "v": "text"}, {"id": "integer", "v": "text"}, True, ("id",), True, Hashing.RECORD),
    ({"id": "integer", "v": "text"}, {"id": "integer", "v": "text"}, False, ("id",), True, Hashing.TEXT),
    ({"id": "text", "v": "text"}, {"id": "text", "v": "text"}, True, ("id",), False, Hashing.RECORD),
], ids=["types-differ", "same-types", "no-record-hash", "text-key"])
def test_the_shape_of_a_comparison(pub, sub, record, key, integer, hashing):
    shape = compare_shape(T, ("id", "v"), ("id",), pub, sub, record)
    assert (shape.key, shape.integer_key, shape.hashing) == (key, integer, hashing)


def test_a_key_not_published_compares_as_a_multiset():
    shape = compare_shape(T, ("v",), ("id",), {"v": "text"}, {"v": "text"})
    assert shape.key == () and shape.describe() == "as a multiset of rows (no key), hashed as text"


def test_bucket_sums_add_up_across_readers_and_differ_where_they_should():
    pub = add_sums(add_sums({}, [(0, 2, 10), (1, 1, 5)]), [(0, 1, 7)])
    sub = add_sums({}, [(0, 3, 17), (2, 1, 4)])
    assert pub == {0: (3, 17), 1: (1, 5)}
    assert differing_buckets(pub, sub) == [1, 2]


def test_groups_pack_buckets_up_to_a_row_bound():
    assert groups([0, 1, 2, 5], {0: 60, 1: 50, 2: 10, 5: 200}, limit=100) == [[0], [1, 2], [5]]
    assert runs([5, 1, 2, 3, 7]) == [(1, 3), (5, 5), (7, 7)]


def test_rows_matched_by_key():
    diff = diff_keyed([("(1)", 10), ("(2)", 20), ("(3)", 30)], [("(2)", 20), ("(3)", 31), ("(4)", 40)])
    assert (diff.missing, diff.extra, diff.different) == (1, 1, 1)
    assert diff.examples == {"missing": ["(1)"], "extra": ["(4)"], "different": ["(3)"]}


def test_rows_matched_as_multisets():
    diff = diff_multiset([("(a)", 3), ("(b)", 1)], [("(a)", 1), ("(b)", 2), ("(c)", 1)])
    assert (diff.missing, diff.extra, diff.different) == (2, 2, 0)
    assert diff.examples == {"missing": ["(a)"], "extra": ["(b)", "(c)"], "different": []}


def test_examples_are_the_smallest_keys_and_few():
    diff = diff_keyed([(f"({i:04})", i) for i in range(500)], [])
    assert diff.missing == 500 and diff.examples["missing"] == [f"({i:04})" for i in range(EXAMPLES)]
