"""The capture objects on the publisher: one logical slot (pgoutput) and the capture publications.

Under ``filtering: source`` (core/spec/subscription.py) there are no capture publications: the slot is read
through the subscription's own publications, and a refresh drops ours (:func:`drop_capture_publications`).
What follows is about ``filtering: spark``.

All are named after the subscription and belong to us alone: a publication of one of our names that
we did not create (its comment is not our marker) is never altered. The filters stay ours to
evaluate, so the capture publications have none; but they never publish an action the subscription's
publications do not publish for a table, because a publication changes what the publisher's own
application may do: PostgreSQL refuses an UPDATE or DELETE on a table without a replica identity as
soon as any publication containing it publishes updates or deletes (CheckCmdReplicaIdentity in
src/backend/executor/execReplication.c; INSERT and TRUNCATE need none).

``publish`` is a property of a publication, not of a table, so there are five of them:
``rowfilter_<sub>`` (every action, the common case and the one publication of earlier versions) for
the leaves whose publications publish all four actions, and ``rowfilter_<sub>_insert``, ``_update``,
``_delete``, ``_truncate`` (one action each) holding every other leaf once per action it is
published for. pgoutput ORs the actions of all the publications it reads through that contain a
table (get_rel_sync_entry in src/backend/replication/pgoutput/pgoutput.c), and PostgreSQL's
replica-identity check ORs them the same way (RelationBuildPublicationDesc in
src/backend/utils/cache/relcache.c), so a leaf gets exactly its actions, for the stream and for the
check. The set is fixed, so tables only ever move between existing publications, in one publisher
transaction; none is dropped while the slot lives, because the slot's pending changes are decoded
with the catalog as of their position and a publication dropped (or created) since would lose (or
fail) them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.connection import one
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.publication.model import ALL_ACTIONS, PublishAction
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.slot_retention import WAY_BACK, Retention, invalidation, wal_level_needed
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.publisher.slot_health import WAL_NOW, SlotHealth, read_slot

MARKER = "managed by airflow-provider-rowfilter for subscription "
NAMEDATALEN = 64  # PostgreSQL's limit: names are at most 63 bytes
#: From this version pgoutput skips a publication that does not exist at a change's position (with a
#: WARNING) instead of failing (LoadPublications in pgoutput.c); before it, a publication created after
#: changes the slot still holds makes them undecodable.
SKIPS_MISSING_PUBLICATIONS = 180000


class CaptureError(RowFilterError):
    """The publisher's slot or capture publication cannot be created or used."""


class SlotInvalidatedError(CaptureError):
    """PostgreSQL invalidated the subscription's slot (``invalidation_reason``): its changes can no longer be read."""

    def __init__(self, message: str, *, reason: str, detail: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, detail=detail, hint=hint)
        self.reason = reason


class SlotMissingError(CaptureError):
    """The subscription's slot does not exist on the publisher (never created, or dropped outside the tool).

    The hint here fits a subscription with no table past ``i``; with one, the slot was lost under it
    and the job says so (subscriber/state.py ``slot_lost``).
    """

    def __init__(self, slot: str) -> None:
        super().__init__(f'replication slot "{slot}" does not exist on the publisher',
                         hint="run `rowfilter refresh` first: it creates the slot and the capture publication")
        self.slot = slot


def capture_names(subscription: str) -> tuple[str, str]:
    """Slot and main capture publication names of a subscription."""
    name = f"rowfilter_{subscription}"
    return name, name


def capture_publication_names(subscription: str) -> dict[PublishAction | None, str]:
    """Every capture publication's name: ``None`` for the all-actions one, else by its one action."""
    main = capture_names(subscription)[1]
    return {None: main, **{a: f"{main}_{a.value}" for a in PublishAction}}


def current_lsn(conn: psycopg.Connection) -> str:
    """Where the publisher's WAL is now (replayed, on a standby)."""
    return one(conn.execute(f"SELECT {WAL_NOW}::text"))[0]


def slot_exists(conn: psycopg.Connection, slot: str) -> bool:
    return one(conn.execute("SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = %s)",
                            (slot,)))[0]


def ensure_slot(conn: psycopg.Connection, slot: str, failover: bool = False) -> bool:
    """Create the logical slot with pgoutput unless it exists; return whether it was created.

    ``failover`` (PostgreSQL 17+, publisher/failover.py ``wanted_failover``) creates it as a failover
    slot, synchronized to standbys (the fifth argument of pg_create_logical_replication_slot; an
    existing slot is switched by publisher/failover.py ``switch_failover``). On a standby the call
    waits for the primary's next running-transactions record (a busy primary writes one every 15 s;
    ``SELECT pg_log_standby_snapshot()`` on it ends the wait).
    """
    row = conn.execute("SELECT plugin, database FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is not None:
        plugin, database = row
        if plugin != "pgoutput" or database != conn.info.dbname:
            raise CaptureError(f'replication slot "{slot}" exists with plugin {plugin!r} in database {database!r}',
                               hint=f"drop it (SELECT pg_drop_replication_slot('{slot}')) or choose another "
                               "subscription name")
        return False
    try:
        if failover:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)", (slot,))
        else:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    except psycopg.Error as e:
        raise CaptureError(f'cannot create logical replication slot "{slot}": {e.diag.message_primary}',
                           detail=e.diag.message_detail,
                           hint=e.diag.message_hint or f"the publisher needs {wal_level_needed(conn.info.server_version)}"
                           " (a standby: on its primary), a free max_replication_slots entry, and a role with "
                           "REPLICATION") from e
    return True


def invalidated_error(slot: SlotHealth, retention: Retention | None = None,
                      stranded: Sequence[tuple[str, str | None]] = ()) -> SlotInvalidatedError:
    """The error for a slot PostgreSQL invalidated, naming its cause from ``invalidation_reason``.

    :param stranded: the tables past ``i`` with their positions: their changes since are gone from the slot.
    """
    reason = slot.invalidated or "wal_removed"
    cause, fix = invalidation(reason, retention, slot.inactive_since)
    listed = ", ".join(f"{t} ({'no position' if lsn is None else 'at ' + lsn})" for t, lsn in stranded)
    detail = (f"pg_replication_slots.invalidation_reason = {reason}: {cause}. PostgreSQL can no longer decode the "
              "slot" + (f"; the changes after the positions of {listed} cannot be read from it" if stranded else "")
              + ". Nothing was captured, applied or advanced")
    return SlotInvalidatedError(
        f'replication slot "{slot.name}" was invalidated by the publisher ({reason})', detail=detail,
        hint=f"to keep it from happening again: {fix}. {WAY_BACK[0].upper()}{WAY_BACK[1:]}", reason=reason)


def capture_layout(subscription: str, actions: Mapping[TableName, frozenset[PublishAction]]
                   ) -> dict[str, tuple[frozenset[PublishAction], frozenset[TableName]]]:
    """Each capture publication's ``publish`` actions and leaves (a leaf published for nothing is in none)."""
    names = capture_publication_names(subscription)
    layout: dict[str, tuple[frozenset[PublishAction], set[TableName]]] = {
        name: (ALL_ACTIONS if action is None else frozenset({action}), set()) for action, name in names.items()}
    for leaf, published in actions.items():
        for action in ([None] if published == ALL_ACTIONS else sorted(published, key=list(PublishAction).index)):
            layout[names[action]][1].add(leaf)
    return {name: (publish, frozenset(leaves)) for name, (publish, leaves) in layout.items()}


def _publish_option(actions: Iterable[PublishAction]) -> sql.Composable:
    text = ", ".join(a.value for a in PublishAction if a in set(actions))
    return sql.SQL("publish = {}").format(sql.Literal(text))


def ensure_capture_publications(conn: psycopg.Connection, subscription: str,
                                actions: Mapping[TableName, frozenset[PublishAction]], *,
                                slot_exists: bool, columns: Mapping[TableName, tuple[str, ...]] | None = None) -> bool:
    """Make the capture publications publish each leaf for exactly its ``actions``; return whether anything changed.

    Without a slot yet, all five are created (before the slot, so that they exist at every position
    it will decode). With a slot, a missing one (an installation from before they were five) is
    created only when a leaf needs it, and refused on publishers older than PostgreSQL 18, whose
    pgoutput cannot decode the slot's pending changes through a publication younger than them.
    Everything happens in one transaction: a leaf moving between publications is never in none. ``columns``:
    the leaves that get a column list (core/publication/subscription_filters.py ``leaf_capture_columns``), the same in
    each publication of theirs; the others get none.
    """
    marker = MARKER + subscription
    layout = capture_layout(subscription, actions)
    existing: dict[str, str | None] = dict(conn.execute(
        """SELECT pubname, obj_description(oid, 'pg_publication') FROM pg_publication
           WHERE pubname = ANY(%s)""", (list(layout),)).fetchall())
    for name, comment in sorted(existing.items()):
        if comment != marker:
            raise CaptureError(f'publication "{name}" exists on the publisher and is not ours',
                               hint="we never alter a publication someone else uses; rename the subscription or "
                               "drop that publication")
    missing = [n for n in layout if n not in existing and (not slot_exists or layout[n][1])]
    for name in missing:
        if len(name.encode()) >= NAMEDATALEN:
            raise CaptureError(f'capture publication name "{name}" is longer than {NAMEDATALEN - 1} bytes',
                               hint="use a subscription name of at most 44 characters")
    if missing and slot_exists and conn.info.server_version < SKIPS_MISSING_PUBLICATIONS:
        name = missing[0]
        leaves = ", ".join(str(t) for t in sorted(layout[name][1]))
        slot = capture_names(subscription)[0]
        raise CaptureError(
            f'capture publication "{name}" does not exist and replication slot "{slot}" does',
            detail=f"{leaves} must be captured for {', '.join(a.value for a in layout[name][0])} only, through "
            f"that publication; created now, PostgreSQL {conn.info.server_version // 10000} could no longer decode "
            f'the changes the slot holds from before it (publication "{name}" does not exist)',
            hint=f"apply until the subscription is caught up, then SELECT pg_drop_replication_slot('{slot}') on the "
            "publisher and run `rowfilter refresh --recreate-slot`: it creates the publications, then a new slot, "
            "and copies the subscription's tables again; nothing was changed")
    changed = False
    with conn.transaction():
        for name in missing:
            conn.execute(sql.SQL("CREATE PUBLICATION {} WITH ({})").format(
                sql.Identifier(name), _publish_option(layout[name][0])))
            conn.execute(sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(sql.Identifier(name), sql.Literal(marker)))
            changed = True
        for name in [n for n in layout if n in existing or n in missing]:
            changed |= _set_publication(conn, name, *layout[name], columns or {})
    return changed


def _set_publication(conn: psycopg.Connection, name: str, publish: frozenset[PublishAction],
                     leaves: frozenset[TableName], columns: Mapping[TableName, tuple[str, ...]]) -> bool:
    ident = sql.Identifier(name)
    changed = False
    flags = one(conn.execute(
        "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = %s", (name,)))
    if frozenset(a for a, on in zip(PublishAction, flags, strict=True) if on) != publish:
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET ({})").format(ident, _publish_option(publish)))
        changed = True
    # prattrs (PostgreSQL 15+): the column list, as the names it holds (a set: its order is the table's).
    listed = ("(SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = r.prrelid "
              "AND a.attnum = ANY(r.prattrs))" if conn.info.server_version >= 150000 else "NULL::text[]")
    current = {TableName(s, t): None if cols is None else frozenset(cols) for s, t, cols in conn.execute(
        sql.SQL("""SELECT n.nspname, c.relname, {} FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
           JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE p.pubname = %s""").format(sql.SQL(listed)), (name,))}
    wanted = {t: None if t not in columns else frozenset(columns[t]) for t in leaves}
    if current == wanted:
        return changed
    if leaves:
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET TABLE ").format(ident) + sql.SQL(", ").join(
            sql.SQL("ONLY {}{}").format(table_sql(t), sql.SQL("") if t not in columns else sql.SQL(" ({})").format(
                sql.SQL(", ").join(map(sql.Identifier, columns[t])))) for t in sorted(leaves)))
    else:
        conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE ").format(ident) + sql.SQL(", ").join(
            sql.SQL("ONLY {}").format(table_sql(t)) for t in sorted(current)))
    return True


def capture_publications(conn: psycopg.Connection, subscription: str) -> list[str]:
    """The capture publications of ``subscription`` that exist and are ours: what the capture reads the slot through."""
    names = list(capture_publication_names(subscription).values())
    found = {n for (n,) in conn.execute(
        "SELECT pubname FROM pg_publication WHERE pubname = ANY(%s) AND obj_description(oid, 'pg_publication') = %s",
        (names, MARKER + subscription))}
    return [n for n in names if n in found]


@dataclass(frozen=True)
class DroppedCapture:
    """What :func:`drop_capture_objects` found and dropped on the publisher."""

    slot: str
    publications: tuple[str, ...]  # the capture publications dropped
    slot_dropped: bool = False
    retained_bytes: int | None = None  # WAL the slot was holding back when it was dropped
    left_alone: tuple[str, ...] = ()  # objects of our names that we did not create, untouched
    #: Why PostgreSQL had invalidated the slot dropped (``invalidation_reason``), None when it could still be read.
    invalidated: str | None = None


#: The fix for every refusal of ``rowfilter drop`` while the subscription is in use.
STOP_BEFORE_DROP = ("stop the subscription's DAG first (pause it and let the running task finish), then run "
                    "`rowfilter drop` again; nothing was dropped")


def slot_active_error(slot: str, pid: object) -> CaptureError:
    return CaptureError(f'replication slot "{slot}" is active for PID {pid}',
                        detail="a process is reading the slot: normally a running apply of the subscription",
                        hint=STOP_BEFORE_DROP)


def drop_capture_objects(conn: psycopg.Connection, subscription: str) -> DroppedCapture:
    """Drop the slot (so the publisher stops retaining WAL) and the capture publications, when they are ours.

    Like ``DROP SUBSCRIPTION``, it refuses while the slot is active, before dropping anything. A slot
    of our name that is not a pgoutput slot of this database, and a publication of one of our names
    without our marker, are left alone and reported in ``left_alone``. Nothing there: nothing dropped.
    """
    slot = capture_names(subscription)[0]
    left_alone = []
    row = conn.execute(
        f"""SELECT database, plugin, slot_type, active_pid,
                  pg_wal_lsn_diff({WAL_NOW}, restart_lsn)::bigint
           FROM pg_replication_slots WHERE slot_name = %s""", (slot,)).fetchone()
    slot_ours = row is not None and row[:3] == (conn.info.dbname, "pgoutput", "logical")
    if row is not None and not slot_ours:
        left_alone.append(f'replication slot "{slot}" ({row[2]}, plugin {row[1]!r}, database {row[0]!r}) '
                          "is not the capture slot of this subscription")
    active_pid, retained = (None, None) if row is None else (row[3], row[4])
    if slot_ours and active_pid is not None:
        raise slot_active_error(slot, active_pid)
    # An invalidated slot holds nothing that can still be decoded (and, but for wal_removed, PostgreSQL keeps its
    # restart_lsn: the "retained" WAL is not retained for it): dropped all the same, said as such.
    invalidated = read_slot(conn, slot)[1].invalidated if slot_ours else None
    names = list(capture_publication_names(subscription).values())
    ours = capture_publications(conn, subscription)
    for (name,) in conn.execute("SELECT pubname FROM pg_publication WHERE pubname = ANY(%s) ORDER BY pubname",
                                (names,)):
        if name not in ours:
            left_alone.append(f'publication "{name}" was not created by rowfilter for subscription {subscription!r}')
    if slot_ours:
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        except psycopg.errors.ObjectInUse as e:  # it became active since we looked
            raise slot_active_error(slot, (e.diag.message_primary or "").rpartition(" ")[2] or "?") from e
        except psycopg.Error as e:
            raise CaptureError(f'cannot drop replication slot "{slot}": {e.diag.message_primary}',
                               hint="the publisher role needs REPLICATION (docs/operators.md, Security)") from e
    _drop_publications(conn, ours)
    return DroppedCapture(slot, tuple(ours), slot_dropped=slot_ours,
                          retained_bytes=retained if slot_ours and not invalidated else None,
                          left_alone=tuple(left_alone), invalidated=invalidated)


def _drop_publications(conn: psycopg.Connection, names: Iterable[str]) -> None:
    for name in names:
        try:
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
        except psycopg.Error as e:
            raise CaptureError(f'cannot drop publication "{name}": {e.diag.message_primary}',
                               hint="only its owner (the role that ran `rowfilter refresh`) or a superuser can "
                               "drop it") from e


def drop_capture_publications(conn: psycopg.Connection, subscription: str) -> list[str]:
    """Drop the capture publications of ours (``filtering: source`` reads the slot through the subscription's
    own publications); return their names.

    Safe for the slot: a source-mode capture never reads through them, and changes captured through them
    are in the change log already. Safe for the publisher: a publication gone never makes its DML fail,
    while one kept and no longer reconciled could (CheckCmdReplicaIdentity in
    src/backend/executor/execReplication.c). Ones of our names that are not ours stay.
    """
    ours = capture_publications(conn, subscription)
    with conn.transaction():
        _drop_publications(conn, ours)
    return ours
