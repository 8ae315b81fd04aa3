"""The capture objects on the publisher: one logical slot (pgoutput) and one unfiltered publication.

Both are named after the subscription and belong to us alone; a publication of that name that we
did not create is never altered. The filters stay ours to evaluate: the capture publication
publishes every change of the subscribed tables' leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.relation import TableName

MARKER = "managed by airflow-provider-rowfilter for subscription "


class CaptureError(RowFilterError):
    """The publisher's slot or capture publication cannot be created or used."""


@dataclass(frozen=True)
class CaptureObjects:
    slot: str
    publication: str
    slot_created: bool
    publication_changed: bool


def capture_names(subscription: str) -> tuple[str, str]:
    """Slot and capture publication names of a subscription."""
    name = f"rowfilter_{subscription}"
    return name, name


def current_lsn(conn: psycopg.Connection) -> str:
    return conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def ensure_slot(conn: psycopg.Connection, slot: str) -> bool:
    """Create the logical slot with pgoutput unless it exists; return whether it was created."""
    row = conn.execute("SELECT plugin, database FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is not None:
        plugin, database = row
        if plugin != "pgoutput" or database != conn.info.dbname:
            raise CaptureError(f'replication slot "{slot}" exists with plugin {plugin!r} in database {database!r}',
                               hint=f"drop it (SELECT pg_drop_replication_slot('{slot}')) or choose another "
                               "subscription name")
        return False
    try:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    except psycopg.Error as e:
        raise CaptureError(f'cannot create logical replication slot "{slot}": {e.diag.message_primary}',
                           hint="the publisher needs wal_level=logical, a free max_replication_slots entry, and "
                           "a role with REPLICATION") from e
    return True


def ensure_capture_publication(conn: psycopg.Connection, name: str, subscription: str,
                               leaves: Sequence[TableName]) -> bool:
    """Make the capture publication publish exactly ``leaves``; return whether anything changed."""
    marker = MARKER + subscription
    row = conn.execute(
        "SELECT p.oid, obj_description(p.oid, 'pg_publication') FROM pg_publication p WHERE pubname = %s",
        (name,)).fetchone()
    ident = sql.Identifier(name)
    tables = sql.SQL(", ").join(sql.SQL("ONLY {}.{}").format(sql.Identifier(t.schema), sql.Identifier(t.name))
                                for t in leaves)
    if row is None:
        stmt = sql.SQL("CREATE PUBLICATION {}").format(ident)
        if leaves:
            stmt += sql.SQL(" FOR TABLE ") + tables
        conn.execute(stmt)
        conn.execute(sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(ident, sql.Literal(marker)))
        return True
    if row[1] != marker:
        raise CaptureError(f'publication "{name}" exists on the publisher and is not ours',
                           hint="we never alter a publication someone else uses; rename the subscription or drop "
                           "that publication")
    current = {TableName(s, t) for s, t in conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,))}
    if current == set(leaves):
        return False
    if leaves:
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET TABLE ").format(ident) + tables)
    else:
        for t in sorted(current):
            conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}.{}").format(
                ident, sql.Identifier(t.schema), sql.Identifier(t.name)))
    return True


@dataclass(frozen=True)
class DroppedCapture:
    """What :func:`drop_capture_objects` found and dropped on the publisher."""

    slot: str
    publication: str
    slot_dropped: bool = False
    retained_bytes: int | None = None  # WAL the slot was holding back when it was dropped
    publication_dropped: bool = False
    left_alone: tuple[str, ...] = ()  # objects of our names that we did not create, untouched


#: The fix for every refusal of ``rowfilter drop`` while the subscription is in use.
STOP_BEFORE_DROP = ("stop the subscription's DAG first (pause it and let the running task finish), then run "
                    "`rowfilter drop` again; nothing was dropped")


def slot_active_error(slot: str, pid: object) -> CaptureError:
    return CaptureError(f'replication slot "{slot}" is active for PID {pid}',
                        detail="a process is reading the slot: normally a running apply of the subscription",
                        hint=STOP_BEFORE_DROP)


def drop_capture_objects(conn: psycopg.Connection, subscription: str) -> DroppedCapture:
    """Drop the slot (so the publisher stops retaining WAL) and the capture publication, when they are ours.

    Like ``DROP SUBSCRIPTION``, it refuses while the slot is active, before dropping anything. A slot
    of our name that is not a pgoutput slot of this database, and a publication of our name without
    our marker, are left alone and reported in ``left_alone``. Nothing there: nothing dropped.
    """
    slot, publication = capture_names(subscription)
    left_alone = []
    row = conn.execute(
        """SELECT database, plugin, slot_type, active_pid,
                  pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint
           FROM pg_replication_slots WHERE slot_name = %s""", (slot,)).fetchone()
    slot_ours = row is not None and row[:3] == (conn.info.dbname, "pgoutput", "logical")
    if row is not None and not slot_ours:
        left_alone.append(f'replication slot "{slot}" ({row[2]}, plugin {row[1]!r}, database {row[0]!r}) '
                          "is not the capture slot of this subscription")
    if slot_ours and row[3] is not None:
        raise slot_active_error(slot, row[3])
    pub = conn.execute("SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s",
                       (publication,)).fetchone()
    publication_ours = pub is not None and pub[0] == MARKER + subscription
    if pub is not None and not publication_ours:
        left_alone.append(f'publication "{publication}" was not created by rowfilter for subscription '
                          f"{subscription!r}")
    if slot_ours:
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        except psycopg.errors.ObjectInUse as e:  # it became active since we looked
            raise slot_active_error(slot, (e.diag.message_primary or "").rpartition(" ")[2] or "?") from e
        except psycopg.Error as e:
            raise CaptureError(f'cannot drop replication slot "{slot}": {e.diag.message_primary}',
                               hint="the publisher role needs REPLICATION (docs/operators.md, Security)") from e
    if publication_ours:
        try:
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))
        except psycopg.Error as e:
            raise CaptureError(f'cannot drop publication "{publication}": {e.diag.message_primary}',
                               hint="only its owner (the role that ran `rowfilter refresh`) or a superuser can "
                               "drop it") from e
    return DroppedCapture(slot, publication, slot_dropped=slot_ours, retained_bytes=row[4] if slot_ours else None,
                          publication_dropped=publication_ours, left_alone=tuple(left_alone))
