"""core/spec/schedule.py: a schedule's longest gap between two runs (what the slot's limits are held against)."""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.schedule import longest_gap, parse_duration
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec


@pytest.mark.parametrize(("schedule", "seconds"), [
    ("*/5 * * * *", 300), ("@hourly", 3600), ("@daily", 86400), ("0 9 * * 1-5", 3 * 86400),  # Friday -> Monday
    ("@monthly", 31 * 86400), ("5min", 300), ("90s", 90), ("2h", 7200), ("1d", 86400), (120, 120), ("1.5h", 5400),
    ("@continuous", 0), ("@once", None), (None, None),
], ids=str)
def test_longest_gap(schedule, seconds):
    assert longest_gap(schedule) == seconds


@pytest.mark.parametrize("bad", ["every day", "61 * * * *", "5 minutes"])
def test_a_schedule_that_is_neither_cron_nor_duration_is_refused(bad):
    with pytest.raises(SpecError, match="neither a cron expression nor a duration"):
        longest_gap(bad)


def test_durations_take_postgresql_units():
    assert [parse_duration(t, "x") for t in ("250ms", "3s", "2min", "1h", "1d", "7")] == [0.25, 3, 120, 3600, 86400, 7]
    with pytest.raises(SpecError, match="is not a duration"):
        parse_duration(-1, "x")


def test_a_factory_spec_file_takes_its_schedule(tmp_path):
    path = tmp_path / "s1.yaml"
    path.write_text("subscription: s1\npublications: [p1]\nairflow:\n  schedule: '@hourly'\n")
    assert SubscriptionSpec.load(path).apply_schedule == "@hourly"
    path.write_text("subscription: s1\npublications: [p1]\nairflow:\n  pool: p\n")  # the factory's default schedule
    assert SubscriptionSpec.load(path).apply_schedule == "*/5 * * * *"
    path.write_text("subscription: s1\npublications: [p1]\napply_schedule: 10min\nairflow:\n  schedule: '@hourly'\n")
    assert SubscriptionSpec.load(path).apply_schedule == "10min"
    path.write_text("subscription: s1\npublications: [p1]\n")
    assert SubscriptionSpec.load(path).apply_schedule is None
    path.write_text("subscription: s1\npublications: [p1]\napply_schedule: sometimes\n")
    with pytest.raises(SpecError, match="apply_schedule of subscription 's1' = 'sometimes'"):
        SubscriptionSpec.load(path)
