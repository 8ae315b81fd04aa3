"""How often the subscription's apply reads its slot: the spec's ``apply_schedule``, as the longest gap between two runs.

The publisher invalidates a slot nobody reads for longer than ``idle_replication_slot_timeout``
(PostgreSQL 18) and one whose WAL outgrows ``max_slot_wal_keep_size``; a slot of ours is read only
while an apply runs, so what decides is the schedule (core/slot_retention.py compares them).

``apply_schedule`` is what the apply DAG's ``schedule`` is: a cron expression or one of Airflow's
presets (``@hourly``), read with croniter (the library Airflow's own cron timetables use), or a
duration in PostgreSQL's time units (``'90s'``, ``'5min'``, ``'2h'``, ``'1d'``; a bare number is
seconds). A spec file of the DAG factory that sets none takes its ``airflow: schedule``
(core/spec/subscription.py ``SubscriptionSpec.load``).
"""

from __future__ import annotations

import datetime as dt
import re

from airflow_provider_rowfilter.core.errors import SpecError

#: The incremental-sync schedule of the DAG factory when a spec file's ``airflow:`` section sets none.
FACTORY_DEFAULT_SCHEDULE = "*/5 * * * *"
#: Airflow's schedules that are not a period: run only when triggered (``@once``), or back to back.
MANUAL = ("@once", "none", "None")
CONTINUOUS = "@continuous"
#: PostgreSQL's time units of a setting (GUC_UNIT_MS … in src/backend/utils/misc/guc.c), in seconds.
TIME_UNITS = {"ms": 0.001, "s": 1, "min": 60, "h": 3600, "d": 86400}
#: The longest duration taken: PostgreSQL's time settings are 32-bit integers (guc.c), INT_MAX seconds at most.
MAX_SECONDS = 2**31 - 1
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|min|h|d)?\s*$")
#: A duration as text (``'30s'``, ``'5min'``, a bare number of seconds): what :func:`parse_duration` reads.
DURATION = _DURATION
#: Schedule intervals a batch may be late by before the subscription is lagging (no max_batch_age set): the
#: Replication page's verdict and the watch DAG's lag check.
LATE_INTERVALS = 3
#: Runs of a cron schedule looked at for its longest gap (a year of them at most: a monthly or
#: weekday-only schedule repeats within it).
_RUNS_LOOKED_AT = 2000


def parse_duration(text: str | int | float, what: str) -> float:
    """Seconds of ``'5min'``-style text (PostgreSQL's units), or of a bare number of seconds."""
    if isinstance(text, bool):
        raise SpecError(f"{what} = {text!r} is not a duration", hint="write e.g. '5min', '2h', '1d' or seconds")
    if isinstance(text, int | float):
        if not 0 <= text <= MAX_SECONDS:  # also refuses nan; compared as given: 10**400 is no float
            raise SpecError(f"{what} = {_shown(text)} is not a duration",
                            hint=f"a number of seconds from 0 to {MAX_SECONDS} (68 years)")
        return float(text)
    match = _DURATION.match(text)
    if match is None:
        raise SpecError(f"{what} = {_shown(text)} is not a duration",
                        hint="write e.g. '5min', '2h', '1d' (PostgreSQL's units: ms, s, min, h, d) or seconds")
    seconds = float(match.group(1)) * TIME_UNITS[match.group(2) or "s"]
    if seconds > MAX_SECONDS:
        raise SpecError(f"{what} = {_shown(text)} is longer than {MAX_SECONDS} seconds (68 years)",
                        hint="write the apply DAG's schedule ('*/5 * * * *', '@hourly') or a duration ('5min')")
    return seconds


def _shown(value: object) -> str:
    """``value!r``, a huge one cut (a number of 300 digits is not worth quoting whole)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def longest_gap(schedule: str | int | float | None, what: str = "apply_schedule") -> float | None:
    """The longest time in seconds between two runs of ``schedule``; None when it runs only when triggered
    (or is not known); 0 for ``@continuous``.

    :raises SpecError: a schedule that is neither a duration nor a cron expression croniter reads.
    """
    if schedule is None or (isinstance(schedule, str) and schedule.strip() in MANUAL):
        return None
    if isinstance(schedule, str) and schedule.strip() == CONTINUOUS:
        return 0.0
    if not isinstance(schedule, str) or _DURATION.match(schedule):
        return parse_duration(schedule, what)
    # Airflow's dependency (its cron timetables), imported only for a cron text; it ships no type hints.
    from croniter import croniter  # type: ignore[import-untyped]

    try:
        runs = croniter(schedule.strip(), dt.datetime(2025, 1, 1))
        previous = runs.get_next(dt.datetime)
        end = previous + dt.timedelta(days=366)
        gap = 0.0
        for _ in range(_RUNS_LOOKED_AT):
            following = runs.get_next(dt.datetime)
            gap = max(gap, (following - previous).total_seconds())
            if following > end:
                break
            previous = following
    except (ValueError, KeyError, TypeError) as e:  # croniter's CroniterBadCronError is a ValueError
        raise SpecError(f"{what} = {schedule!r} is neither a cron expression nor a duration: {e}",
                        hint="write the apply DAG's schedule ('*/5 * * * *', '@hourly') or a duration ('5min')") from None
    return gap
