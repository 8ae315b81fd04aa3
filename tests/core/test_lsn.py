"""LSN text form <-> integer, as PostgreSQL's pg_lsn prints and reads it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn


@pytest.mark.parametrize(("text", "value"), [
    ("0/0", 0), ("0/16B3748", 0x16B3748), ("1/0", 1 << 32), ("FFFFFFFF/FFFFFFFF", 2**64 - 1), ("a/b", 0xA0000000B),
], ids=["zero", "low", "high", "max", "lower-case"])
def test_parse(text, value):
    assert parse_lsn(text) == value


@pytest.mark.parametrize("text", ["", "16B3748", "0/", "/1", "0/123456789", "0x0/1", "0/1 "])
def test_parse_refuses_what_pg_lsn_refuses(text):
    with pytest.raises(RowFilterError, match="invalid input syntax for type pg_lsn"):
        parse_lsn(text)


@given(st.integers(0, 2**64 - 1))
def test_round_trip_upper_case_without_padding(value):
    text = format_lsn(value)
    assert parse_lsn(text) == value and text == text.upper() and not text.startswith("0" * 2)
