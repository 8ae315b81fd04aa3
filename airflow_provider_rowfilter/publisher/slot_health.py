"""What the subscription's slot holds back on the publisher (``pg_replication_slots``), for ``status``.

A logical slot keeps every WAL segment from its ``restart_lsn`` on. From PostgreSQL 13 the view says
whether that WAL is still guaranteed (``wal_status``: ``reserved``, within ``max_wal_size``;
``extended``, beyond it but kept; ``unreserved``, past ``max_slot_wal_keep_size`` and removed at the
next checkpoint; ``lost``, removed: the slot is invalidated) and how much more may be written before
it is lost (``safe_wal_size``; null without ``max_slot_wal_keep_size``). See PostgreSQL's
src/backend/replication/slotfuncs.c, pg_get_replication_slots(), and GetWALAvailability() in
src/backend/access/transam/xlog.c. A slot that is gone or lost can no longer give the changes since
the tables' positions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import psycopg


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

    @property
    def lost(self) -> bool:
        return self.wal_status == "lost"

    def as_dict(self) -> dict:
        return asdict(self)


def read_slot(conn: psycopg.Connection, slot: str) -> tuple[str, SlotHealth]:
    """The publisher's current WAL position, and ``slot`` in this database (a logical slot of another
    database, or none, counts as absent)."""
    # wal_status and safe_wal_size appeared in PostgreSQL 13; before, nothing says whether WAL is kept.
    since_13 = conn.info.server_version >= 130000
    row = conn.execute(
        f"""SELECT pg_current_wal_lsn()::text, s.slot_name IS NOT NULL, s.active,
                   {"s.wal_status" if since_13 else "NULL::text"},
                   pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint,
                   {"s.safe_wal_size" if since_13 else "NULL::bigint"},
                   s.restart_lsn::text, s.confirmed_flush_lsn::text
            FROM (SELECT 1) one LEFT JOIN pg_replication_slots s
                 ON s.slot_name = %s AND s.slot_type = 'logical' AND s.database = current_database()""",
        (slot,)).fetchone()
    current, exists, *rest = row
    return current, SlotHealth(slot, exists, *rest)
