"""Whole-DataFrame equality for tests (chispa-style), without pyspark.pandas.

``pyspark.testing.assertDataFrameEqual`` imports ``pyspark.pandas``, which does not import with
pandas 3; this compares the same things: column names and types, and every row.
"""

from __future__ import annotations

from collections import Counter

from pyspark.sql import DataFrame, Row


def assert_dataframe_equal(actual: DataFrame, expected: DataFrame, *, check_row_order: bool = False) -> None:
    """Assert equal columns (names and types, nullability ignored) and equal rows, order optional."""
    actual_columns = [(f.name, f.dataType.simpleString()) for f in actual.schema.fields]
    expected_columns = [(f.name, f.dataType.simpleString()) for f in expected.schema.fields]
    assert actual_columns == expected_columns, "columns differ"
    actual_rows = [_hashable(row) for row in actual.collect()]
    expected_rows = [_hashable(row) for row in expected.collect()]
    if check_row_order:
        assert actual_rows == expected_rows
        return
    missing = Counter(expected_rows) - Counter(actual_rows)
    unexpected = Counter(actual_rows) - Counter(expected_rows)
    assert not missing and not unexpected, (
        f"rows missing: {dict(missing)}; rows unexpected: {dict(unexpected)}"
    )


def _hashable(value: object) -> object:
    """A row's value with arrays, structs and maps turned into tuples, so rows can be counted."""
    if isinstance(value, Row):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value
