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

**Readiness** of each standby to take over the slot is publisher/readiness.py.

**Carrying on** (:func:`check_lineage`, called by the capture before it reads or moves the slot). A
change-log segment records the publisher's system identifier and timeline (``pg_control_system()``;
the timeline in ``pg_walfile_name(pg_current_wal_lsn())``). A slot continues the log when it is on
the same cluster lineage (same system identifier), when every position the log and the tables hold
lies on the publisher's own history (at or before the point where its timeline forked from the one
the log was captured on: the history file, read with ``TIMELINE_HISTORY``), and when the slot starts
at or behind the log's end (the capture then recognises the changes the log has by position and
advances the slot past them; publisher/capture.py). A slot synchronized from the old primary
passes; one created after the promotion starts past the fork and is refused, as is a log ending past
the fork (changes the promoted standby never received: what ``synchronized_standby_slots`` prevents)
and a server of another cluster. A position taken from the publisher's WAL without decoding (a copy's
or a reconcile's snapshot, refresh's ``r`` without copy) waits for the standbys of
``synchronized_standby_slots`` to confirm it (:func:`wait_for_standbys`), as decoding does, and is
recorded with the publisher's timeline (:func:`confirmed_timeline`): one taken on an older timeline past
the fork (nothing waited: the setting was missing) is refused, naming the tables and ``rowfilter
reconcile`` as the repair (docs/adr/slot-lineage-after-promotion.md).
"""

from __future__ import annotations

import logging
import time

import psycopg

from airflow_provider_rowfilter.change_log.identity import LogNeeds, ServerOrigin
from airflow_provider_rowfilter.connection import connect, primary_message
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
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
    standby = _one(conn, "SELECT pg_is_in_recovery()")[0]
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


#: How long an initial copy waits for the standbys of synchronized_standby_slots to confirm its position.
STANDBY_WAIT_SECONDS = 60.0


class StandbyWaitError(CaptureError):
    """The standbys the primary waits for did not confirm the copy's position in time (a later run may)."""

    transient = True


def wait_for_standbys(pub: psycopg.Connection, lsn: str, *, timeout: float | None = None) -> None:
    """Wait until every physical slot of the primary's ``synchronized_standby_slots`` has confirmed ``lsn``.

    PostgreSQL makes logical decoding wait so (WaitForStandbyConfirmation in src/backend/replication/slot.c):
    nothing reaches a subscriber that a standby to be promoted lacks. A position a job takes from the
    publisher's WAL without decoding (a copy's or a reconcile's snapshot, refresh's ``r`` without copy) waits
    here before it is recorded or any row read at it is written, so that no table ever holds a position or
    rows a promoted standby never received. Nothing to wait for on a standby, or without the setting.

    :param timeout: seconds; default :data:`STANDBY_WAIT_SECONDS`.
    :raises StandbyWaitError: naming the slots still behind (transient: the operators retry).
    """
    timeout = STANDBY_WAIT_SECONDS if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        listed, standby = _one(pub, "SELECT current_setting('synchronized_standby_slots', true), "
                                    "pg_is_in_recovery()")
        names = [n.strip().strip('"') for n in (listed or "").split(",") if n.strip()]
        if standby or not names:
            return
        behind = pub.execute(
            "SELECT n, s.restart_lsn::text FROM unnest(%s::text[]) AS n LEFT JOIN pg_replication_slots s "
            "ON s.slot_name = n WHERE s.restart_lsn IS NULL OR s.restart_lsn < %s::pg_lsn", (names, lsn)).fetchall()
        if not behind:
            return
        if time.monotonic() > deadline:
            listed_behind = ", ".join(f'"{n}" ({"missing or invalidated" if r is None else "at " + r})'
                                      for n, r in behind)
            raise StandbyWaitError(
                f"the standbys of synchronized_standby_slots have not confirmed the position {lsn} after "
                f"{timeout:.0f} s: {listed_behind}",
                detail="a position taken from the publisher (a copy's or reconcile's snapshot, a table added without "
                "copy) waits for them as PostgreSQL's logical decoding does, so that a promoted standby never lacks "
                "what a table holds; nothing was recorded or copied",
                hint="bring the standby back (or take its slot out of synchronized_standby_slots on the primary), "
                "then run the job again")
        time.sleep(0.05)


def confirmed_timeline(pub: psycopg.Connection, lsn: str, *, timeout: float | None = None) -> int | None:
    """Wait for the standbys to confirm ``lsn`` (:func:`wait_for_standbys`); return the publisher's timeline (None
    on a standby): what a table position taken from ``pub`` is recorded with, so that after a promotion it is told
    from a position of the new timeline (:func:`check_lineage`). A primary keeps its timeline while it runs."""
    wait_for_standbys(pub, lsn, timeout=timeout)
    return origin_of(*_one(pub, f"SELECT {ORIGIN_COLUMNS} FROM pg_control_system()")).timeline


def _one(conn: psycopg.Connection, query: str) -> tuple:
    """The one row of a query that always returns one."""
    row = conn.execute(query).fetchone()
    assert row is not None, query
    return row


# --- carrying on after a promotion -------------------------------------------------------------------
#: The select-list columns of :func:`origin_of`: the server's system identifier, and its current WAL file on a
#: primary (whose name starts with the timeline, 8 hexadecimal digits: XLogFileName in xlog_internal.h).
ORIGIN_COLUMNS = ("system_identifier::text, CASE WHEN pg_is_in_recovery() THEN NULL "
                  "ELSE pg_walfile_name(pg_current_wal_lsn()) END")


def origin_of(system_identifier: str, walfile: str | None) -> ServerOrigin:
    """Which server (:data:`ORIGIN_COLUMNS` read from ``pg_control_system()``): the timeline None on a standby."""
    return ServerOrigin(system_identifier, None if walfile is None else int(walfile[:8], 16))


def timeline_history(spec: SubscriptionSpec, timeline: int) -> list[tuple[int, int]]:
    """The timelines ``timeline`` descends from, each with where it ended: ``TIMELINE_HISTORY`` on a
    replication connection (the history file's lines, ``tli<TAB>switchpoint<TAB>reason``)."""
    if timeline <= 1:
        return []
    try:
        with connect(spec.publisher, "publisher", spec, replication="database") as repl:
            _, content = _one(repl, f"TIMELINE_HISTORY {int(timeline)}")
    except psycopg.Error as e:
        raise CaptureError(f"cannot read the publisher's timeline history (timeline {timeline}): {primary_message(e)}",
                           hint="the capture reads it once after a promotion, over a replication connection: the "
                           "publisher's role needs REPLICATION and a pg_hba.conf 'replication' line") from e
    text = bytes(content).decode() if isinstance(content, bytes | bytearray | memoryview) else str(content)
    history = []
    for line in text.splitlines():
        fields = line.strip().split("\t")
        if len(fields) >= 2 and fields[0].isdigit():
            history.append((int(fields[0]), parse_lsn(fields[1])))
    return history


def check_lineage(spec: SubscriptionSpec, slot: str, recorded: ServerOrigin | None, current: ServerOrigin, *, logged: int | None,
                  confirmed: int, synced: bool | None, needs: LogNeeds | None) -> None:
    """Refuse a publisher on whose history the log's end, a table's position or the slot's start does not lie.

    :param recorded: where the log's newest segment was captured (None: an empty or older log).
    :param logged: the log's end; ``confirmed``: the slot's position; ``synced``: its ``synced`` flag.
    :param needs: the tables' positions, each with the timeline it was taken on where it was taken from the
        publisher's WAL directly (a copy, a reconcile, refresh without copy); a batch end lies in the log, on the
        log's timeline.
    :raises LineageError: naming what lies off the history, and the fix; nothing was read or moved.
    """
    if recorded is not None and recorded.system_identifier != current.system_identifier:
        raise LineageError(
            f"the publisher is another PostgreSQL cluster (system identifier {current.system_identifier}) than the "
            f"one this change log was captured from ({recorded.system_identifier})",
            detail="WAL positions of one cluster mean nothing on another: its changes cannot be told from the log's. "
            "Nothing was captured, applied or advanced",
            hint="point publisher at the cluster the subscription replicates from (or a standby of it, promoted); a "
            "new cluster (restored, pg_upgrade) needs `rowfilter refresh --recreate-slot`, which copies the tables "
            "again")
    if current.timeline is None:
        return  # a standby: it follows its primary's history
    base = None if recorded is None else recorded.timeline
    taken_on = dict(needs.timelines) if needs else {}
    positions = [(t, p, taken_on.get(t, base)) for t, p in (needs.tables if needs else ())]
    if {tl for _, _, tl in positions if tl is not None} | ({base} - {None}) <= {current.timeline}:
        return
    history = dict(timeline_history(spec, current.timeline))
    if base is not None and base != current.timeline:
        _check_log_lineage(slot, base, current.timeline, history, logged=logged, confirmed=confirmed, synced=synced,
                           positions=positions)
    off = [(t, p, tl) for t, p, tl in positions if not _on_history(p, tl, current.timeline, history)]
    if off:
        forks = sorted({(tl, history[tl]) for _, _, tl in off if tl in history})
        listed = ", ".join(f"{t} at {format_lsn(p)} (taken on timeline {tl})" for t, p, tl in off)
        left = "; ".join(f"it left timeline {tl} at {format_lsn(end)}" for tl, end in forks) or \
            "they were taken on timelines that are not in its history"
        raise LineageError(
            f"table positions the promoted publisher never had: {listed}; the publisher is on timeline "
            f"{current.timeline} and {left} (its promotion)",
            detail="a copy's or a reconcile's snapshot, or a table added without copy, was taken on the old primary "
            "past what its standby had received (nothing waited for the standby: synchronized_standby_slots did not "
            "name it): the table may hold rows the promoted publisher never received, and the apply would skip the "
            "promoted publisher's own changes up to that position. Nothing was captured, applied or advanced",
            hint=f"`rowfilter reconcile {' '.join(f'--table {t}' for t, _, _ in off)}` repairs each in place from the "
            "promoted publisher (a new snapshot and position; the table stays readable), then run the apply again. "
            "To keep it from happening: synchronized_standby_slots on the primary naming the standby's physical slot")
    if base is not None and base != current.timeline:
        log.info('replication slot "%s" continues on timeline %d from timeline %d (forked at %s): the log ends at %s, '
                 "the slot is at %s (synced: %s)", slot, current.timeline, base, format_lsn(history[base]),
                 "nothing" if logged is None else format_lsn(logged), format_lsn(confirmed), synced)


def _on_history(position: int, timeline: int | None, current: int, history: dict[int, int]) -> bool:
    """Whether ``position``, taken on ``timeline`` (None: unknown), names WAL the ``current`` timeline has: its own,
    or an ancestor's up to where ``current``'s history left that ancestor."""
    if timeline is None or timeline == current:
        return True
    end = history.get(timeline)
    return end is not None and position <= end


def _check_log_lineage(slot: str, base: int, current: int, history: dict[int, int], *, logged: int | None,
                       confirmed: int, synced: bool | None, positions: list[tuple[str, int, int | None]]) -> None:
    """The log (captured on timeline ``base``) and the slot against the promoted publisher's history."""
    if base not in history:
        raise LineageError(
            f"the publisher's timeline {current} does not descend from timeline {base}, on which the change log was "
            "captured",
            detail="its history forked before the log's changes: they may be missing on this server. Nothing was "
            "captured, applied or advanced",
            hint="point publisher at the server promoted from the old primary's standby; else `rowfilter refresh "
            "--recreate-slot` copies the tables again")
    fork = history[base]
    promoted = f"the publisher's timeline {current} forked from timeline {base} at {format_lsn(fork)} (its promotion)"
    # The tables' positions are checked after the log and the slot (check_lineage): a batch end lies within the
    # log; a copy's, a reconcile's or refresh's waited for the standbys before it was recorded (wait_for_standbys),
    # which holds only where synchronized_standby_slots names them.
    if logged is not None and logged > fork:
        ahead = [f"{t} (at {format_lsn(p)})" for t, p, _ in positions if p > fork]
        raise LineageError(
            f"the subscription holds changes the promoted publisher never received: the change log ends at "
            f"{format_lsn(logged)}, past {format_lsn(fork)}",
            detail=f"{promoted}; what the old primary wrote after that point was lost with it, and the log (and "
            f"{', '.join(ahead) if ahead else 'maybe the subscriber'}) already has some of it. Nothing was captured, "
            "applied or advanced",
            hint="copy the tables again: SELECT pg_drop_replication_slot('" + slot + "') on the publisher, then "
            "`rowfilter refresh --recreate-slot` (it moves this log aside and sends the tables back to i). To keep "
            "it from happening: synchronized_standby_slots on the primary naming the standby's physical slot, so "
            "that decoding never runs ahead of the standby")
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
