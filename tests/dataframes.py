"""Whole-DataFrame equality for tests (chispa-style), without pyspark.pandas.

``pyspark.testing.assertDataFrameEqual`` imports ``pyspark.pandas``, which does not import with
pandas 3; this compares the same things: column names and types, and every row.
"""

from __future__ import annotations

from collections import Counter

from pyspark.sql import DataFrame


def assert_dataframe_equal(actual: DataFrame, expected: DataFrame, *, check_row_order: bool = False) -> None:
    """Assert equal columns (names and types, nullability ignored) and equal rows, order optional."""
    actual_columns = [(f.name, f.dataType.simpleString()) for f in actual.schema.fields]
    expected_columns = [(f.name, f.dataType.simpleString()) for f in expected.schema.fields]
    assert actual_columns == expected_columns, "columns differ"
    actual_rows = [tuple(row) for row in actual.collect()]
    expected_rows = [tuple(row) for row in expected.collect()]
    if check_row_order:
        assert actual_rows == expected_rows
        return
    missing = Counter(expected_rows) - Counter(actual_rows)
    unexpected = Counter(actual_rows) - Counter(expected_rows)
    assert not missing and not unexpected, (
        f"rows missing: {dict(missing)}; rows unexpected: {dict(unexpected)}"
    )
