"""Failover: the slot as a failover slot, its readiness on each standby, and carrying on after a promotion.

**Failover slots** (PostgreSQL 17+). A slot created with ``failover`` is copied to the standbys whose
``sync_replication_slots`` is on (the slot sync worker, src/backend/replication/logical/slotsync.c),
so that a promoted standby holds it. :func:`wanted_failover` decides from the spec and the server;
refresh creates the slot so (publisher/capture_objects.py ``ensure_slot``) and switches an existing
one with ``ALTER_REPLICATION_SLOT … (FAILOVER …)`` on a replication connection (:func:`switch_failover`;
PostgreSQL 17 and 18 offer no SQL function for it). The initial copy's own slot is temporary, which
PostgreSQL never synchronizes (ReplicationSlotCreate refuses "failover for a temporary replication
slot"): a copy in progress (``d``) starts again after a failover, as a native table in ``i``/``d``
does; a table in ``f`` needs the standby to have replayed its copy's position instead of a synced
table-sync slot.

**Readiness** (:func:`readiness`): the "Logical Replication Failover" procedure of PostgreSQL's
logical replication chapter, adapted to our slot. On the primary, the slots that must survive are
ours (``failover AND NOT temporary``); on each standby, one is ready when
``synced AND NOT temporary AND invalidation_reason IS NULL`` (17: ``NOT conflicting``). Beside the
two queries, what makes a standby not ready is named with its fix: ``sync_replication_slots``,
``hot_standby_feedback``, ``primary_slot_name`` on the standby, ``synchronized_standby_slots`` on the
primary (without it, decoding may run ahead of the standby, and a promotion loses what the subscriber
already has), and the replay of each ``f`` table's copy position.

**Carrying on** (:func:`check_lineage`, called by the capture before it reads or moves the slot). A
change-log segment records the publisher's system identifier and timeline (``pg_control_system()``;
the timeline in ``pg_walfile_name(pg_current_wal_lsn())``). A slot continues the log when it is on
the same cluster lineage (same system identifier), when every position the log and the tables hold
lies on the publisher's own history (at or before the point where its timeline forked from the one
the log was captured on: the history file, read with ``TIMELINE_HISTORY``), and when the slot starts
at or behind the log's end (the capture then recognises the changes the log has by position and
advances the slot past them; publisher/capture.py). A slot synchronized from the old primary
passes; one created after the promotion starts past the fork and is refused, as is a log or a table
position past the fork (changes the promoted standby never received: what ``synchronized_standby_slots``
prevents) and a server of another cluster.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import psycopg

from airflow_provider_rowfilter.change_log.identity import LogNeeds, Origin
from airflow_provider_rowfilter.connection import connect, primary_message
from airflow_provider_rowfilter.core.conninfo import redact
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.spec import CONN_ID, SubscriptionSpec
from airflow_provider_rowfilter.publisher.capture_objects import CaptureError

log = logging.getLogger(__name__)

#: Failover slots and their synchronization to standbys: PostgreSQL 17.
FAILOVER_VERSION = 170000
#: Logical decoding on a standby: PostgreSQL 16.
STANDBY_DECODING_VERSION = 160000


class LineageError(CaptureError):
    """The publisher is not on the history the change log (or a table's position) was captured from."""


def wanted_failover(spec: SubscriptionSpec, conn: psycopg.Connection) -> bool:
    """Whether the subscription's slot is a failover slot on this publisher: the spec's ``failover``, on by
    default where the server can (a primary of 17+); refused when asked for where it cannot."""
    standby = conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
    version = conn.info.server_version
    if spec.failover is False or (spec.failover is None and (standby or version < FAILOVER_VERSION)):
        return False
    if version < FAILOVER_VERSION:
        raise CaptureError(f"failover: true, and the publisher is PostgreSQL {version // 10000}: failover slots "
                           "need PostgreSQL 17+", hint="leave failover unset (or false) for this publisher")
    if standby:
        # ReplicationSlotCreate in src/backend/replication/slot.c: no failover slot created on a standby.
        raise CaptureError("failover: true, and the publisher is a standby: cannot enable failover for a "
                           "replication slot created on the standby",
                           hint="leave failover unset (or false) to capture from a standby")
    return True


def switch_failover(spec: SubscriptionSpec, slot: str, failover: bool, *, attempts: int = 5) -> bool:
    """Make the existing ``slot`` a failover slot or not (``ALTER_REPLICATION_SLOT``); return whether it changed.

    Only while no session reads the slot (PostgreSQL acquires it): a running capture is waited for a few
    times, then a CaptureError says so (nothing changed).
    """
    with connect(spec.publisher, "publisher", spec) as pub:
        if pub.info.server_version < FAILOVER_VERSION:
            return False
        row = pub.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is None or row[0] == failover:
        return False
    for attempt in range(attempts):
        try:
            with connect(spec.publisher, "publisher", spec, replication="database") as repl:
                repl.execute(f'ALTER_REPLICATION_SLOT "{slot}" ( FAILOVER {"true" if failover else "false"} )')
            log.info('replication slot "%s" is now %sa failover slot', slot, "" if failover else "not ")
            return True
        except psycopg.errors.ObjectInUse as e:
            if attempt == attempts - 1:
                raise CaptureError(f'cannot switch replication slot "{slot}" to failover = {str(failover).lower()}: '
                                   f"{primary_message(e)}", hint="an apply is reading the slot; run refresh again "
                                   "when it has finished") from e
            time.sleep(0.2 * (attempt + 1))
        except psycopg.Error as e:
            raise CaptureError(f'cannot switch replication slot "{slot}" to failover = {str(failover).lower()}: '
                               f"{primary_message(e)}", detail=e.diag.message_detail,
                               hint="ALTER_REPLICATION_SLOT needs a replication connection (a pg_hba.conf "
                               "'replication' line for the publisher's role) and REPLICATION") from e
    return False  # pragma: no cover - the loop returns or raises


# --- readiness ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Readiness:
    """Whether one standby could take over with the subscription's slot, as PostgreSQL's procedure checks it."""

    standby: str  # where it is (host:port, or the connection id), never a password
    ready: bool
    slot: dict | None = None  # the slot on the standby: synced, temporary, invalidation_reason, confirmed_flush_lsn
    problems: tuple[str, ...] = field(default=())  # each what is wrong, and the fix

    def as_dict(self) -> dict:
        return asdict(self)


def standby_label(standby: str) -> str:
    """How a standby is named in output: its connection id, or host:port of its URL (no secret)."""
    if CONN_ID.match(standby):
        return standby
    try:
        params = psycopg.conninfo.conninfo_to_dict(standby)
    except psycopg.ProgrammingError:
        return redact(standby)
    return f"{params.get('host', 'localhost')}:{params.get('port', '5432')}"


#: A standby to check: how it is named, and how to open a session on it.
Standby = tuple[str, Callable[[], psycopg.Connection]]


def spec_standbys(spec: SubscriptionSpec) -> list[Standby]:
    """The spec's ``standbys``, each reached with the publisher's credentials (connection.py ``password``)."""
    def opener(standby: str) -> Callable[[], psycopg.Connection]:
        def open_standby() -> psycopg.Connection:
            if CONN_ID.match(standby):
                raise RowFilterError(f"standby {standby!r} is an Airflow connection id",
                                     hint="run where Airflow and its connections are (the operators and the DAG "
                                     "factory's files resolve it), or give its URL")
            return connect(standby, "standby", spec)
        return open_standby
    return [(standby_label(s), opener(s)) for s in spec.standbys]


def readiness(pub: psycopg.Connection, slot: str, standbys: Sequence[Standby],
              copied: Sequence[tuple[str, str]] = ()) -> list[Readiness]:
    """Each standby's readiness to take over the subscription's ``slot`` (read now).

    :param pub: a connection to the publisher (the primary).
    :param standbys: the standbys (:func:`spec_standbys`).
    :param copied: the tables in ``f`` with their copy positions: the standby must have replayed them.
    """
    primary = _primary_facts(pub, slot)
    return [_standby_readiness(label, open_standby, slot, primary, copied) for label, open_standby in standbys]


@dataclass(frozen=True)
class _Primary:
    version: int
    standby: bool
    slot_failover: bool | None
    slot_exists: bool
    synchronized: tuple[str, ...]  # synchronized_standby_slots
    physical: dict[str, bool]  # the physical slots: name -> active


def _primary_facts(pub: psycopg.Connection, slot: str) -> _Primary:
    version = pub.info.server_version
    standby = pub.execute("SELECT pg_is_in_recovery()").fetchone()[0]
    row = pub.execute(f"SELECT {'failover' if version >= FAILOVER_VERSION else 'NULL::bool'} "
                      "FROM pg_replication_slots WHERE slot_name = %s AND NOT temporary", (slot,)).fetchone()
    listed = pub.execute("SELECT current_setting('synchronized_standby_slots', true)").fetchone()[0] or ""
    physical = dict(pub.execute("SELECT slot_name::text, active FROM pg_replication_slots "
                                "WHERE slot_type = 'physical'").fetchall())
    names = tuple(n.strip().strip('"') for n in listed.split(",") if n.strip())
    return _Primary(version, standby, None if row is None else row[0], row is not None, names, physical)


def _standby_readiness(label: str, open_standby: Callable[[], psycopg.Connection], slot: str, primary: _Primary,
                       copied: Sequence[tuple[str, str]]) -> Readiness:
    if primary.version < FAILOVER_VERSION or primary.standby:
        why = (f"the publisher is PostgreSQL {primary.version // 10000}: slots are synchronized to standbys from 17"
               if not primary.standby else "the publisher is itself a standby: its slots are not synchronized")
        return Readiness(label, False, problems=(why,))
    problems: list[str] = []
    if not primary.slot_exists:
        problems.append(f'replication slot "{slot}" does not exist on the primary: `rowfilter refresh` creates it')
    elif not primary.slot_failover:
        problems.append(f'replication slot "{slot}" is not a failover slot: `rowfilter refresh` makes it one '
                        "(failover: true, or unset, in the spec)")
    try:
        with open_standby() as conn:
            facts = _standby_facts(conn, slot)
    except (RowFilterError, psycopg.Error) as e:
        return Readiness(label, False, problems=(*problems, f"cannot read the standby: {_said(e)}"))
    if not facts["in_recovery"]:
        return Readiness(label, False, problems=(*problems, "it is not a standby (pg_is_in_recovery() is false): "
                                                 "list the primary's physical standbys in standbys"))
    if facts["sync_replication_slots"] != "on":
        problems.append("sync_replication_slots is off on the standby: ALTER SYSTEM SET sync_replication_slots = on; "
                        "SELECT pg_reload_conf() (there; its primary_conninfo must name a dbname)")
    if facts["hot_standby_feedback"] != "on":
        problems.append("hot_standby_feedback is off on the standby: ALTER SYSTEM SET hot_standby_feedback = on; "
                        "SELECT pg_reload_conf() (there)")
    physical = facts["primary_slot_name"]
    if not physical:
        problems.append("primary_slot_name is not set on the standby: SELECT "
                        "pg_create_physical_replication_slot('standby1') on the primary, then ALTER SYSTEM SET "
                        "primary_slot_name = 'standby1' on the standby")
    else:
        if physical not in primary.physical:
            problems.append(f'the standby streams through physical slot "{physical}", which does not exist on the '
                            f"primary: SELECT pg_create_physical_replication_slot('{physical}') there")
        if physical not in primary.synchronized:
            problems.append(f"synchronized_standby_slots on the primary does not name the standby's slot "
                            f'"{physical}": logical decoding may then run ahead of the standby, and a promotion '
                            "would lose changes the subscriber already has. Fix: ALTER SYSTEM SET "
                            f"synchronized_standby_slots = '{', '.join((*primary.synchronized, physical))}'; "
                            "SELECT pg_reload_conf() on the primary")
    found = facts["slot"]
    if found is None:
        problems.append(f'replication slot "{slot}" is not on the standby yet: its slot sync worker has not '
                        "copied it (it needs the settings above, and a failover slot on the primary)")
    else:
        if not found["synced"]:
            problems.append(f'replication slot "{slot}" on the standby was not synchronized from the primary '
                            "(synced is false): drop it there; the slot sync worker then copies the primary's")
        if found["temporary"]:
            problems.append(f'replication slot "{slot}" is on the standby but not persisted yet (temporary): '
                            "PostgreSQL keeps it once the primary's slot has moved past the standby's oldest WAL, "
                            "which the next applies do")
        if found["invalidation_reason"]:
            problems.append(f'replication slot "{slot}" on the standby is invalidated '
                            f'({found["invalidation_reason"]})')
    replayed = facts["replayed"]
    for table, lsn in copied:
        if replayed is None or parse_lsn(replayed) < parse_lsn(lsn):
            problems.append(f"table {table} finished its initial copy consistent with {lsn}, which the standby has "
                            f"not replayed yet (it is at {replayed or 'nothing'}): wait for it, or the table is "
                            "copied again after a failover")
    return Readiness(label, not problems, found, tuple(problems))


def _standby_facts(conn: psycopg.Connection, slot: str) -> dict:
    version = conn.info.server_version
    in_recovery, sync, feedback, physical, replayed = conn.execute(
        "SELECT pg_is_in_recovery(), current_setting('sync_replication_slots', true), "
        "current_setting('hot_standby_feedback'), current_setting('primary_slot_name'), "
        "pg_last_wal_replay_lsn()::text").fetchone()
    found = None
    if version >= FAILOVER_VERSION:
        # The documentation's query on the standby (18: invalidation_reason IS NULL; 17: NOT conflicting).
        bad = "invalidation_reason" if version >= 180000 else "CASE WHEN conflicting THEN 'conflict' END"
        row = conn.execute(f"SELECT synced, temporary, {bad}, confirmed_flush_lsn::text, "
                           f"(synced AND NOT temporary AND {bad} IS NULL) AS failover_ready "
                           "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        if row is not None:
            found = dict(zip(("synced", "temporary", "invalidation_reason", "confirmed_flush_lsn", "failover_ready"),
                             row, strict=True))
    return {"in_recovery": in_recovery, "sync_replication_slots": sync, "hot_standby_feedback": feedback,
            "primary_slot_name": physical, "replayed": replayed, "slot": found}


def _said(e: BaseException) -> str:
    if isinstance(e, RowFilterError):
        return e.message + (f" ({e.detail})" if e.detail else "")
    return primary_message(e) if isinstance(e, psycopg.Error) else str(e)


# --- carrying on after a promotion -------------------------------------------------------------------
def publisher_origin(pub: psycopg.Connection) -> Origin:
    """The publisher's system identifier and (on a primary) timeline, as the log records them."""
    system, walfile = pub.execute(
        "SELECT system_identifier::text, CASE WHEN pg_is_in_recovery() THEN NULL "
        "ELSE pg_walfile_name(pg_current_wal_lsn()) END FROM pg_control_system()").fetchone()
    # A WAL file name starts with its timeline, 8 hexadecimal digits (XLogFileName in xlog_internal.h).
    return Origin(system, None if walfile is None else int(walfile[:8], 16))


def timeline_history(spec: SubscriptionSpec, timeline: int) -> list[tuple[int, int]]:
    """The timelines ``timeline`` descends from, each with where it ended: ``TIMELINE_HISTORY`` on a
    replication connection (the history file's lines, ``tli<TAB>switchpoint<TAB>reason``)."""
    if timeline <= 1:
        return []
    try:
        with connect(spec.publisher, "publisher", spec, replication="database") as repl:
            _, content = repl.execute(f"TIMELINE_HISTORY {int(timeline)}").fetchone()
    except psycopg.Error as e:
        raise CaptureError(f"cannot read the publisher's timeline history (timeline {timeline}): {primary_message(e)}",
                           hint="the capture reads it once after a promotion, over a replication connection: the "
                           "publisher's role needs REPLICATION and a pg_hba.conf 'replication' line") from e
    text = content.decode() if isinstance(content, bytes | bytearray | memoryview) else str(content)
    history = []
    for line in text.splitlines():
        fields = line.strip().split("\t")
        if len(fields) >= 2 and fields[0].isdigit():
            history.append((int(fields[0]), parse_lsn(fields[1])))
    return history


def check_lineage(spec: SubscriptionSpec, slot: str, recorded: Origin | None, current: Origin, *, logged: int | None,
                  confirmed: int, synced: bool | None, needs: LogNeeds | None) -> None:
    """Refuse a publisher on whose history the log's end, a table's position or the slot's start does not lie.

    :param recorded: where the log's newest segment was captured (None: an older log, not checked).
    :param logged: the log's end; ``confirmed``: the slot's position; ``synced``: its ``synced`` flag.
    :raises LineageError: naming what lies off the history, and the fix; nothing was read or moved.
    """
    if recorded is None:
        return
    if recorded.system_identifier != current.system_identifier:
        raise LineageError(
            f"the publisher is another PostgreSQL cluster (system identifier {current.system_identifier}) than the "
            f"one this change log was captured from ({recorded.system_identifier})",
            detail="WAL positions of one cluster mean nothing on another: its changes cannot be told from the log's. "
            "Nothing was captured, applied or advanced",
            hint="point publisher at the cluster the subscription replicates from (or a standby of it, promoted); a "
            "new cluster (restored, pg_upgrade) needs `rowfilter refresh --recreate-slot`, which copies the tables "
            "again")
    if recorded.timeline is None or current.timeline is None or recorded.timeline == current.timeline:
        return
    history = dict(timeline_history(spec, current.timeline))
    if recorded.timeline not in history:
        raise LineageError(
            f"the publisher's timeline {current.timeline} does not descend from timeline {recorded.timeline}, on "
            "which the change log was captured",
            detail="its history forked before the log's changes: they may be missing on this server. Nothing was "
            "captured, applied or advanced",
            hint="point publisher at the server promoted from the old primary's standby; else `rowfilter refresh "
            "--recreate-slot` copies the tables again")
    fork = history[recorded.timeline]
    promoted = (f"the publisher's timeline {current.timeline} forked from timeline {recorded.timeline} at "
                f"{format_lsn(fork)} (its promotion)")
    ahead = [f"the change log's end {format_lsn(logged)}"] if logged is not None and logged > fork else []
    ahead += [f"table {t} at {format_lsn(p)}" for t, p in (needs.tables if needs else ()) if p > fork]
    if ahead:
        raise LineageError(
            f"the subscription holds changes the promoted publisher never received: {', '.join(ahead)}, past "
            f"{format_lsn(fork)}",
            detail=f"{promoted}; what the old primary wrote after that point was lost with it, and the subscriber "
            "already has some of it. Nothing was captured, applied or advanced",
            hint="copy the tables named again (`rowfilter resync --table T --copy`; a table past the fork holds rows "
            "the publisher does not). To keep it from happening: synchronized_standby_slots on the primary naming "
            "the standby's physical slot, so that decoding never runs ahead of the standby")
    if confirmed > fork:
        made = "it was not synchronized from the old primary (synced is false)" if synced is False else \
            "it does not continue the old primary's slot"
        raise LineageError(
            f'replication slot "{slot}" starts at {format_lsn(confirmed)}, after {promoted}: {made}',
            detail="a slot made after the promotion holds none of the changes between the log's end "
            f"({'empty' if logged is None else format_lsn(logged)}) and its start. Nothing was captured, applied or "
            "advanced",
            hint="before a failover, check that the standby is ready (`rowfilter status` with standbys in the spec); "
            "now, `rowfilter refresh --recreate-slot` copies the tables again")
    log.info('replication slot "%s" continues on %s: the log ends at %s, the slot is at %s (synced: %s)',
             slot, promoted, "nothing" if logged is None else format_lsn(logged), format_lsn(confirmed), synced)
