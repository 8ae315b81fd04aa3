"""Sizes, durations, ages and counts as the CLI and the task logs say them (issue 18, items 7 and 10)."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from rich.console import Console

from airflow_provider_rowfilter.console.output import Column, print_table
from airflow_provider_rowfilter.humane import ago, batch_lag, counts_text, duration, size


@pytest.mark.parametrize(("seconds", "said"), [
    (0, "0 ms"), (0.4, "400 ms"), (11.852699, "11.9 s"), (59.94, "59.9 s"), (60, "1 min"), (192, "3 min 12 s"),
    (3600, "1 h"), (7500, "2 h 5 min"), (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"), (-2, "0 ms"),
])
def test_duration(seconds, said):
    assert duration(seconds) == said


def test_size_age_counts_and_lag():
    assert [size(n) for n in (0, 1023, 64 * 1024, int(776.7 * 2**20), 5 * 2**40)] == [
        "0 B", "1,023 B", "64.0 kB", "776.7 MB", "5120.0 GB"]
    now = dt.datetime(2025, 1, 1, 12, tzinfo=dt.timezone.utc)
    assert ago(now - dt.timedelta(minutes=20), now) == "20 min ago"
    assert ago(now + dt.timedelta(seconds=0.5), now) == "just now"
    assert counts_text({"skipped": 2, "insert": 3, "zzz": 1, "update": 0}) == "insert 3, skipped 2, zzz 1"
    assert counts_text({}) == "no changes"
    assert batch_lag(0, None) == "lag when captured: 0 B"
    assert batch_lag(None, None) == "lag when captured: not measured (no transaction captured)"


def test_plain_rows_align_wide_characters():
    out = io.StringIO()
    console = Console(file=out, width=80)
    print_table(console, [Column("table", whole=True), Column("state")],
                [["public.注文", "r"], ["public.orders", "i"]], fmt="plain")
    header, first, second = out.getvalue().splitlines()
    assert [line.rindex(s) for line, s in ((header, "state"), (first, "r"), (second, "i"))] == [15, 13, 15]
