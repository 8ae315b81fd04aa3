"""What makes the publisher invalidate the subscription's slot on its own, held against the schedule, and how
an invalidation is named.

A native subscription keeps its slot busy all day; ours is read only while an apply runs. Between
runs, PostgreSQL may invalidate it for two reasons a schedule controls (InvalidatePossiblyObsoleteSlot
in src/backend/replication/slot.c, at a checkpoint): nobody read it for longer than
``idle_replication_slot_timeout`` (PostgreSQL 18, ``idle_timeout``), or the WAL it holds back grew
past ``max_slot_wal_keep_size`` (13+, ``wal_removed``). Two more need no schedule: ``rows_removed``
(a slot on a standby whose primary removed catalog rows it needed) and ``wal_level_insufficient``.
An invalidated slot can no longer be decoded: the changes after the tables' positions are gone from
it. ``validate``, ``refresh`` and ``status`` warn before (:func:`schedule_risks`), the lag check
alerts while it approaches (:func:`idle_alert`), and every error names the cause from
``pg_replication_slots.invalidation_reason`` (:func:`invalidation`), never a guess.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from airflow_provider_rowfilter.humane import duration, size

#: "A pause of a few intervals": warn when this many missed runs in a row (a paused DAG, failing
#: runs) would leave the slot to be invalidated.
PAUSE_RUNS = 3
#: The lag check alerts once the slot has been idle for this share of idle_replication_slot_timeout.
IDLE_ALERT_SHARE = 0.5

#: What exists today to get a subscription whose slot was invalidated going again. (A repair in place that
#: does not empty the tables is `rowfilter reconcile`, another piece of work; this text changes with it.)
WAY_BACK = ("the way back: `rowfilter refresh --recreate-slot --reconcile` (RefreshPublicationOperator("
            "recreate_slot=True, reconcile=True)) drops the invalidated slot, creates a new one and repairs the "
            "subscription's tables in place, never emptying them (docs/verify.md); without --reconcile it empties "
            "them and copies them again")


def stamp(at: dt.datetime) -> str:
    """``2026-11-27T06:27:33+00:00``: a time as messages give it, in UTC, to the second (a microsecond says nothing
    to a person, and the Replication page shows none)."""
    return at.astimezone(dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class Retention:
    """The publisher's limits on what an unread slot may keep, as ``pg_settings`` and ``pg_stat_wal`` show them.

    :param idle_timeout: ``idle_replication_slot_timeout`` in seconds; None when 0 (off) or before PostgreSQL 18.
    :param max_keep: ``max_slot_wal_keep_size`` in bytes; None when -1 (no cap) or before PostgreSQL 13.
    :param wal_rate: the WAL the publisher writes, bytes per second, on average since ``wal_rate_since``
        (``pg_stat_wal.wal_bytes``, 14+); None when unknown.
    """

    idle_timeout: float | None = None
    max_keep: int | None = None
    wal_rate: float | None = None
    wal_rate_since: dt.datetime | None = None
    #: the publisher's ``server_version_num`` (what a fix naming ``wal_level`` says depends on it); 0: unknown
    server_version: int = 0

    def as_dict(self) -> dict:
        return {"idle_replication_slot_timeout_seconds": self.idle_timeout,
                "max_slot_wal_keep_size_bytes": self.max_keep,
                "wal_bytes_per_second": None if self.wal_rate is None else round(self.wal_rate, 1),
                "wal_rate_since": None if self.wal_rate_since is None else self.wal_rate_since.isoformat()}


IDLE_FIX = ("raise idle_replication_slot_timeout on the publisher past the longest pause you accept (ALTER SYSTEM "
            "SET idle_replication_slot_timeout = '3d'; SELECT pg_reload_conf(); 0 turns it off), or run the apply "
            "more often")
KEEP_FIX = ("raise max_slot_wal_keep_size on the publisher (ALTER SYSTEM SET max_slot_wal_keep_size = '…'; "
            "SELECT pg_reload_conf(); -1 removes the cap, and the disk must hold what the slot keeps), or run "
            "the apply more often")


def schedule_risks(retention: Retention, gap: float | None, schedule: str | int | None) -> list[str]:
    """Warnings, each with its fix, when the schedule (its longest ``gap`` between two runs, seconds) or a pause
    of up to :data:`PAUSE_RUNS` missed runs would leave the slot to be invalidated."""
    every = "" if schedule is None else f" ({schedule})"
    found = []
    if retention.idle_timeout is not None:
        timeout = duration(retention.idle_timeout)
        if gap is None:
            found.append(f"idle_replication_slot_timeout is {timeout} on the publisher: the slot is invalidated "
                         f"(idle_timeout) when no apply reads it for {timeout}; set apply_schedule in the spec (the "
                         "apply DAG's schedule) so that the schedule is checked against it")
        else:
            found += _runs_left("idle_replication_slot_timeout", timeout, retention.idle_timeout / gap if gap else None,
                                gap, every, "idle_timeout", IDLE_FIX)
    if retention.max_keep is not None and retention.wal_rate and gap is not None:
        written = retention.wal_rate * gap
        rate = f"at the publisher's average WAL rate of {size(round(retention.wal_rate))}/s"
        found += _runs_left("max_slot_wal_keep_size", size(retention.max_keep),
                            retention.max_keep / written if written else None, gap, every, "wal_removed",
                            KEEP_FIX, f" ({rate}, {size(round(written))} between two runs)")
    return found


def _runs_left(setting: str, limit: str, ratio: float | None, gap: float, every: str, reason: str, fix: str,
               why: str = "") -> list[str]:
    """The warning for a limit that a gap of ``ratio`` times the schedule's reaches (None: never)."""
    if ratio is None:
        return []
    # Read at 0, next at (k + 1) gaps when k runs in a row are missed: invalidated once (k + 1) * gap > limit,
    # first for k = floor(limit / gap).
    missed = int(ratio)
    if missed == 0:
        return [f"the apply runs every {duration(gap)}{every}, and {setting} is {limit} on the publisher{why}: the "
                f"slot is invalidated ({reason}) between two runs. Fix: {fix}"]
    if missed <= PAUSE_RUNS:
        runs = f"{missed} missed run{'s' if missed > 1 else ''} in a row (a paused DAG, failing runs) " \
            + ("invalidates" if missed == 1 else "invalidate")
        return [f"{runs} the slot ({reason}): {setting} is {limit} on the publisher and the apply runs every "
                f"{duration(gap)}{every}{why}. Fix: {fix}"]
    return []


def idle_alert(retention: Retention, inactive_since: dt.datetime | None, now: dt.datetime) -> str | None:
    """What the lag check says when the slot has been idle for :data:`IDLE_ALERT_SHARE` of the timeout or more."""
    if retention.idle_timeout is None or inactive_since is None:
        return None
    idle = max((now - inactive_since).total_seconds(), 0.0)
    if idle < retention.idle_timeout * IDLE_ALERT_SHARE:
        return None
    left = retention.idle_timeout - idle
    when = f"in about {duration(left)}" if left > 0 else "at the publisher's next checkpoint"
    return (f"its slot has not been read for {duration(idle)} (inactive since {stamp(inactive_since)}): the "
            f"publisher invalidates it after idle_replication_slot_timeout ({duration(retention.idle_timeout)}), "
            f"{when}. Run the apply now (is its DAG paused, or failing?); {IDLE_FIX}")


#: invalidation_reason -> (what happened, how to keep it from happening again). PostgreSQL's names
#: (SlotInvalidationCauses in src/backend/replication/slot.c).
CAUSES = {
    "wal_removed": ("the publisher removed WAL the slot still needed: it held back more than "
                    "max_slot_wal_keep_size{keep}", KEEP_FIX),
    "idle_timeout": ("nobody read it for longer than idle_replication_slot_timeout{idle}{since}", IDLE_FIX),
    "rows_removed": ("the primary removed catalog rows the slot still needed (a slot on a standby whose "
                     "hot_standby_feedback was off, or whose physical slot, primary_slot_name, was missing)",
                     "on the standby, set hot_standby_feedback = on and primary_slot_name to a physical slot on the "
                     "primary"),
    "wal_level_insufficient": ("wal_level on the primary was lowered below logical",
                               "set wal_level = logical on the primary (it needs a restart)"),
    "conflict": ("it conflicted with recovery on this standby (rows_removed or wal_level_insufficient: PostgreSQL "
                 "16 does not say which)",
                 "on the standby, set hot_standby_feedback = on and primary_slot_name; keep wal_level = logical on "
                 "the primary"),
}
#: What PostgreSQL 19 says otherwise: logical decoding is on while wal_level = logical, or while a logical slot
#: exists under wal_level = replica (:data:`LOGICAL_ON_DEMAND_VERSION`); slot.c's DETAIL for the invalidation says so.
CAUSES_SINCE_19 = {
    "wal_level_insufficient": (
        "logical decoding was turned off on the primary (its effective_wal_level fell below logical: wal_level was "
        "lowered, or its last logical slot was dropped under wal_level = replica)",
        "keep a logical slot on the primary under wal_level = replica (PostgreSQL 19 turns logical decoding off "
        "when the last one is dropped), or set wal_level = logical there (a restart)"),
}


def invalidation(reason: str, retention: Retention | None = None,
                 inactive_since: dt.datetime | None = None) -> tuple[str, str]:
    """(what happened, its fix) for an ``invalidation_reason`` of ``pg_replication_slots``."""
    retention = retention or Retention()
    causes = {**CAUSES, **CAUSES_SINCE_19} if retention.server_version >= LOGICAL_ON_DEMAND_VERSION else CAUSES
    cause, fix = causes.get(reason, (f"invalidation_reason {reason}", "see PostgreSQL's documentation of "
                                     "pg_replication_slots.invalidation_reason"))
    return cause.format(
        keep="" if retention.max_keep is None else f" ({size(retention.max_keep)})",
        idle="" if retention.idle_timeout is None else f" ({duration(retention.idle_timeout)})",
        since="" if inactive_since is None else f"; inactive since {stamp(inactive_since)}"), fix


#: From PostgreSQL 19, logical decoding is switched on when the first logical slot is made under ``wal_level =
#: replica`` and off when the last one is dropped (src/backend/replication/logical/logicalctl.c; the read-only
#: ``effective_wal_level`` reports what is in effect): no restart, and ``replica`` suffices.
LOGICAL_ON_DEMAND_VERSION = 190000


def wal_level_needed(server_version: int) -> str:
    """What a publisher of ``server_version`` (``server_version_num``) needs of ``wal_level`` for a logical slot, as
    a fix says it: ``logical`` and a restart before PostgreSQL 19; ``replica`` or ``logical`` from 19, where making
    the slot switches logical decoding on."""
    if server_version >= LOGICAL_ON_DEMAND_VERSION:
        return ("wal_level = replica or logical (PostgreSQL 19 switches logical decoding on, without a restart, when "
                "the first logical slot is made under replica: effective_wal_level shows it)")
    return "wal_level = logical (a restart)"


@dataclass(frozen=True)
class Exposure:
    """How close one of the publisher's limits is to invalidating the slot: what it would call it
    (``invalidation_reason``), the time left (seconds; 0: the next checkpoint; None: unknown, no WAL rate), and
    whether that is near enough to act on (:data:`IDLE_ALERT_SHARE` of the limit reached)."""

    setting: str  # idle_replication_slot_timeout or max_slot_wal_keep_size
    reason: str  # idle_timeout or wal_removed
    seconds_left: float | None
    at_risk: bool
    said: str  # what stands behind the time left ("not read for 6 min of 10 min")

    def describe(self) -> str:
        """``invalidated (idle_timeout) in about 4 min: not read for 6 min, idle_replication_slot_timeout …``."""
        if self.seconds_left is None:
            when = "when the publisher has written that much more WAL"
        elif self.seconds_left <= 0:
            when = "at the publisher's next checkpoint"
        else:
            when = f"in about {duration(self.seconds_left)}"
        return f"invalidated ({self.reason}) {when}: {self.said}"

    def as_dict(self) -> dict:
        return {"setting": self.setting, "reason": self.reason, "at_risk": self.at_risk,
                "seconds_left": None if self.seconds_left is None else round(max(self.seconds_left, 0.0), 1),
                "said": self.describe()}


def exposures(retention: Retention, *, active: bool | None, inactive_since: dt.datetime | None,
              wal_status: str | None, safe_wal_size: int | None, now: dt.datetime) -> list[Exposure]:
    """The limits that count down on a readable slot now, soonest first (InvalidatePossiblyObsoleteSlot in
    src/backend/replication/slot.c checks both at every checkpoint and restartpoint):

    - ``idle_replication_slot_timeout`` (PostgreSQL 18; in seconds, ``GUC_UNIT_S`` in guc_tables.c): counts from
      ``inactive_since``, only while no session reads the slot (a read resets it: ReplicationSlotAcquire);
    - ``max_slot_wal_keep_size``: ``safe_wal_size`` is the WAL that may still be written before the slot loses
      what it needs (GetWALAvailability in src/backend/access/transam/xlog.c), the time left that over the
      publisher's average WAL rate; ``wal_status = unreserved``: the next checkpoint.
    """
    found = []
    if retention.idle_timeout is not None and not active and inactive_since is not None:
        idle = max((now - inactive_since).total_seconds(), 0.0)
        found.append(Exposure(
            "idle_replication_slot_timeout", "idle_timeout", retention.idle_timeout - idle,
            idle >= retention.idle_timeout * IDLE_ALERT_SHARE,
            f"not read for {duration(idle)} (since {stamp(inactive_since)}), and "
            f"idle_replication_slot_timeout is {duration(retention.idle_timeout)} on the publisher"))
    if wal_status == "unreserved":
        found.append(Exposure("max_slot_wal_keep_size", "wal_removed", 0.0, True,
                              "it holds more WAL than max_slot_wal_keep_size (wal_status unreserved)"))
    elif retention.max_keep is not None and safe_wal_size is not None:
        safe = max(safe_wal_size, 0)
        left = safe / retention.wal_rate if retention.wal_rate else None
        rate = "" if left is None else f" (at the publisher's average rate of {size(round(retention.wal_rate or 0))}/s)"
        found.append(Exposure(
            "max_slot_wal_keep_size", "wal_removed", left, safe <= retention.max_keep * (1 - IDLE_ALERT_SHARE),
            f"{size(safe)} more WAL{rate} before it passes max_slot_wal_keep_size ({size(retention.max_keep)})"))
    return sorted(found, key=lambda e: math.inf if e.seconds_left is None else e.seconds_left)
