"""core/slot_retention.py: what the schedule risks against the publisher's slot limits, and how an
invalidation is named (from PostgreSQL's invalidation_reason, never a guess)."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_provider_rowfilter.core.slot_retention import (
    CAUSES,
    Retention,
    idle_alert,
    invalidation,
    schedule_risks,
    wal_level_needed,
)

MIN = 60.0


@pytest.mark.parametrize(("timeout", "gap", "expected"), [
    (MIN, 5 * MIN, "the slot is invalidated (idle_timeout) between two runs"),
    (5 * MIN, 5 * MIN, "1 missed run in a row (a paused DAG, failing runs) invalidates the slot (idle_timeout)"),
    (10 * MIN, 5 * MIN, "2 missed runs in a row (a paused DAG, failing runs) invalidate the slot (idle_timeout)"),
    (16 * MIN, 5 * MIN, "3 missed runs in a row"),
    (20 * MIN, 5 * MIN, None),  # a pause of a few intervals is survived: the lag check alerts before
    (None, 5 * MIN, None),
])
def test_idle_timeout_against_the_schedule(timeout, gap, expected):
    found = schedule_risks(Retention(idle_timeout=timeout), gap, "*/5 * * * *")
    if expected is None:
        assert found == []
    else:
        (text,) = found
        assert expected in text and "idle_replication_slot_timeout" in text and "ALTER SYSTEM SET" in text, text


def test_an_unknown_schedule_is_said_with_the_timeout():
    (text,) = schedule_risks(Retention(idle_timeout=3600.0), None, None)
    assert "idle_replication_slot_timeout is 1 h" in text and "set apply_schedule" in text


def test_wal_cap_against_the_schedule_at_the_publishers_rate():
    # 1 MB/s for 5 min is 300 MB between two runs: a 1 GB cap survives 2 missed runs, not 3.
    (text,) = schedule_risks(Retention(max_keep=1 << 30, wal_rate=float(1 << 20)), 5 * MIN, None)
    assert "3 missed runs in a row" in text and "(wal_removed)" in text and "max_slot_wal_keep_size" in text, text
    assert schedule_risks(Retention(max_keep=100 << 30, wal_rate=float(1 << 20)), 5 * MIN, None) == []
    assert schedule_risks(Retention(max_keep=1 << 30, wal_rate=None), 5 * MIN, None) == []  # rate unknown


def test_idle_alert_from_inactive_since():
    now = dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone.utc)
    retention = Retention(idle_timeout=3600.0)
    assert idle_alert(retention, now - dt.timedelta(minutes=20), now) is None
    text = idle_alert(retention, now - dt.timedelta(minutes=40), now)
    assert "has not been read for 40 min" in text and "in about 20 min" in text and "Run the apply now" in text
    assert "at the publisher's next checkpoint" in idle_alert(retention, now - dt.timedelta(hours=2), now)
    assert idle_alert(Retention(), now - dt.timedelta(days=3), now) is None  # no timeout: no alert


@pytest.mark.parametrize("reason", sorted(CAUSES))
def test_every_invalidation_reason_is_named_with_its_fix(reason):
    cause, fix = invalidation(reason, Retention(idle_timeout=60.0, max_keep=1 << 30))
    assert cause and fix
    if reason == "idle_timeout":
        assert "idle_replication_slot_timeout (1.0 min)" in cause or "idle_replication_slot_timeout (1 min)" in cause
    if reason == "wal_removed":
        assert "max_slot_wal_keep_size (1.0 GB)" in cause


@pytest.mark.parametrize("version", [170000, 180000, 190000])
def test_a_fix_naming_wal_level_knows_the_publishers_version(version):
    """Before PostgreSQL 19 a logical slot needs wal_level = logical, a restart away; from 19 replica suffices, the
    first logical slot switching logical decoding on (logicalctl.c), and the last one dropped switching it off."""
    needed = wal_level_needed(version)
    cause, fix = invalidation("wal_level_insufficient", Retention(server_version=version))
    if version < 190000:
        assert needed == "wal_level = logical (a restart)"
        assert (cause, fix) == ("wal_level on the primary was lowered below logical",
                                "set wal_level = logical on the primary (it needs a restart)")
    else:
        assert needed.startswith("wal_level = replica or logical") and "without a restart" in needed
        assert "its last logical slot was dropped under wal_level = replica" in cause, cause
        assert fix.startswith("keep a logical slot on the primary under wal_level = replica"), fix


def test_exposures_count_down_on_an_unread_slot():
    """Issue 46 item 1: the time left before the publisher invalidates the slot, and when that is at risk."""
    from airflow_provider_rowfilter.cli.status import subscription_state
    from airflow_provider_rowfilter.core.slot_retention import exposures

    now = dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone.utc)
    retention = Retention(idle_timeout=3600.0, max_keep=1 << 30, wal_rate=float(1 << 20))
    [idle, wal] = sorted(exposures(retention, active=False, inactive_since=now - dt.timedelta(minutes=10),
                                   wal_status="extended", safe_wal_size=900 << 20, now=now), key=lambda e: e.setting)
    assert (idle.reason, idle.seconds_left, idle.at_risk) == ("idle_timeout", 3000.0, False)
    assert idle.describe().startswith("invalidated (idle_timeout) in about 50 min: not read for 10 min")
    assert (wal.reason, wal.seconds_left, wal.at_risk) == ("wal_removed", 900.0, False)
    assert "900.0 MB more WAL" in wal.describe() and "in about 15 min" in wal.describe()
    assert subscription_state(True, [idle, wal]) is None
    assert subscription_state(False, [idle, wal])[0] == "paused"
    [late] = exposures(Retention(idle_timeout=3600.0), active=False, inactive_since=now - dt.timedelta(minutes=40),
                       wal_status="reserved", safe_wal_size=None, now=now)
    assert late.at_risk and late.seconds_left == 1200.0
    name, why = subscription_state(True, [late])
    assert name == "at risk" and "in about 20 min" in why
    assert exposures(retention, active=True, inactive_since=None, wal_status="reserved", safe_wal_size=None,
                     now=now) == []  # read now, and no cap known: nothing counts down
    [lost] = exposures(Retention(), active=False, inactive_since=None, wal_status="unreserved", safe_wal_size=0, now=now)
    assert lost.at_risk and lost.describe().startswith("invalidated (wal_removed) at the publisher's next checkpoint")
