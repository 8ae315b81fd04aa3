"""What the subscription's slot holds back on the publisher (``pg_replication_slots``), and what may invalidate it.

A logical slot keeps every WAL segment from its ``restart_lsn`` on. From PostgreSQL 13 the view says
whether that WAL is still guaranteed (``wal_status``: ``reserved``, within ``max_wal_size``;
``extended``, beyond it but kept; ``unreserved``, past ``max_slot_wal_keep_size`` and removed at the
next checkpoint; ``lost``, removed: the slot is invalidated) and how much more may be written before
it is lost (``safe_wal_size``; null without ``max_slot_wal_keep_size``). From 17 it says why a slot
was invalidated (``invalidation_reason``), since when nobody reads it (``inactive_since``), and
whether it is a failover slot (``failover``) or one synchronized from a primary (``synced``); 16
says only whether a slot on a standby conflicted with recovery (``conflicting``). See PostgreSQL's
src/backend/replication/slotfuncs.c, pg_get_replication_slots(), and GetWALAvailability() in
src/backend/access/transam/xlog.c. A slot that is gone or invalidated can no longer give the changes
since the tables' positions.

The publisher may be a physical standby (capture from a standby, PostgreSQL 16+): its WAL ends where
it has replayed, and ``pg_current_wal_lsn()`` is refused there (:data:`WAL_NOW`, :data:`WAL_END`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass

import psycopg

from airflow_provider_rowfilter.core.slot_retention import Retention

#: The end of the WAL a slot of this server can decode now: flushed on a primary, replayed on a standby
#: (the end_of_wal of pg_logical_slot_get_changes_guts in src/backend/replication/logical/logicalfuncs.c).
WAL_END = "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() END)"
#: Where the server's WAL is now, for lag and retained WAL: inserted on a primary, replayed on a standby.
WAL_NOW = "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)"


@dataclass(frozen=True)
class SlotHealth:
    """One slot as ``pg_replication_slots`` shows it; ``exists`` False when the publisher has none of that name."""

    name: str
    exists: bool
    active: bool | None = None
    wal_status: str | None = None
    retained_bytes: int | None = None
    safe_wal_size: int | None = None
    restart_lsn: str | None = None
    confirmed_flush_lsn: str | None = None
    failover: bool | None = None  # 17+
    synced: bool | None = None  # 17+: synchronized from a primary (on a promoted standby it stays true)
    temporary: bool | None = None
    inactive_since: dt.datetime | None = None  # 17+
    invalidation_reason: str | None = None  # 17+; 16: "conflict" when conflicting; before: wal_removed when lost

    @property
    def invalidated(self) -> str | None:
        """Why PostgreSQL invalidated the slot (core/slot_retention.py ``CAUSES``), or None while it can be read."""
        return self.invalidation_reason or ("wal_removed" if self.wal_status == "lost" else None)

    @property
    def lost(self) -> bool:
        return self.invalidated is not None

    def as_dict(self) -> dict:
        doc = asdict(self)
        doc["inactive_since"] = None if self.inactive_since is None else self.inactive_since.isoformat()
        doc["invalidation_reason"] = self.invalidated
        return doc


def slot_columns(version: int, alias: str = "s") -> str:
    """The version-dependent columns of :class:`SlotHealth`, from ``failover`` on, as a select list."""
    since_17 = version >= 170000
    conflict = (f"CASE WHEN {alias}.conflicting THEN 'conflict' END" if version >= 160000 else "NULL::text")
    return ", ".join([
        f"{alias}.failover" if since_17 else "NULL::bool", f"{alias}.synced" if since_17 else "NULL::bool",
        f"{alias}.temporary", f"{alias}.inactive_since" if since_17 else "NULL::timestamptz",
        f"{alias}.invalidation_reason" if since_17 else conflict])


def read_slot(conn: psycopg.Connection, slot: str) -> tuple[str, SlotHealth]:
    """The publisher's current WAL position, and ``slot`` in this database (a logical slot of another
    database, or none, counts as absent)."""
    version = conn.info.server_version
    # wal_status and safe_wal_size appeared in PostgreSQL 13; before, nothing says whether WAL is kept.
    since_13 = version >= 130000
    row = conn.execute(
        f"""SELECT {WAL_NOW}::text, s.slot_name IS NOT NULL, s.active,
                   {"s.wal_status" if since_13 else "NULL::text"},
                   pg_wal_lsn_diff({WAL_NOW}, s.restart_lsn)::bigint,
                   {"s.safe_wal_size" if since_13 else "NULL::bigint"},
                   s.restart_lsn::text, s.confirmed_flush_lsn::text, {slot_columns(version)}
            FROM (SELECT 1) one LEFT JOIN pg_replication_slots s
                 ON s.slot_name = %s AND s.slot_type = 'logical' AND s.database = current_database()""",
        (slot,)).fetchone()
    current, exists, *rest = row
    return current, SlotHealth(slot, exists, *rest)


def read_retention(conn: psycopg.Connection) -> Retention:
    """The publisher's ``idle_replication_slot_timeout`` and ``max_slot_wal_keep_size``, and the WAL it writes
    per second on average since ``pg_stat_wal`` was reset (settings it does not have count as off)."""
    settings = dict(conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name IN ('idle_replication_slot_timeout', "
        "'max_slot_wal_keep_size')").fetchall())
    # Units as pg_settings gives them: seconds (18), megabytes (13+).
    idle = int(settings.get("idle_replication_slot_timeout", "0"))
    keep = int(settings.get("max_slot_wal_keep_size", "-1"))
    rate = since = None
    if conn.info.server_version >= 140000:
        wal_bytes, since, seconds = conn.execute(
            "SELECT wal_bytes, stats_reset, extract(epoch FROM clock_timestamp() - stats_reset)::float8 "
            "FROM pg_stat_wal").fetchone()
        if seconds and seconds >= 60:  # a rate over less than a minute says little
            rate = float(wal_bytes) / seconds
    return Retention(idle_timeout=float(idle) if idle > 0 else None,
                     max_keep=keep * 1024 * 1024 if keep >= 0 else None, wal_rate=rate, wal_rate_since=since,
                     server_version=conn.info.server_version)
