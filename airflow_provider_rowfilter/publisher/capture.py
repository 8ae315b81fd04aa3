"""Capture: read a subscription's slot, write one durable change-log segment, then advance the slot.

The slot is read through the SQL interface (``pg_logical_slot_peek_binary_changes`` with the
built-in pgoutput plugin) with a server-side cursor, through the subscription's own publications
(``filtering: source``: pgoutput filters, projects and transforms the changes exactly as for a native
subscriber) or our unfiltered capture publications (``spark``: the apply judges); the segment's
metadata records which (``filtering``), so the apply knows how its changes were captured. A fetch at a
time, the INSERT, UPDATE and DELETE messages of a fetch are decoded together into
columns (publisher/change_reader.py, publisher/pgoutput_columns.py), the few others one by one, and the rows go to a
:class:`~airflow_provider_rowfilter.change_log.segment_writer.SegmentWriter` that writes row groups as they
fill: the driver holds one fetch and one row group, however large the backlog. The slot function
returns whole transactions in commit order.

Before anything is read, the log must hold everything the subscriber still needs, continuous up to
the slot's position (``_check_log``), and the slot must be readable (an invalidated one is refused
naming PostgreSQL's ``invalidation_reason``) and continue the log: after a promotion, the log's
positions must lie on the promoted server's history (publisher/failover.py ``check_lineage``);
otherwise the capture refuses and changes nothing. Each segment records which server it was read
from (its system identifier and timeline).

The order is what makes it exactly once (docs/change-log.md): the segment is written under a
temporary name, fsynced and renamed; the position is recorded; only then is the slot advanced with
``pg_replication_slot_advance``. A crash before the rename leaves the slot where it was and the
rerun reads the same range again; a crash after it is finished by the rerun, which finds the log
ahead of the slot and advances the slot to the log's end without reading anything twice.

Heartbeat: the flush position of the publisher's WAL is read before the slot. When the read was not
cut short by the bound, every transaction whose commit record starts before that position was
decoded, so the slot can be advanced there even when nothing (or nothing more) was for us; an idle
slot, or one whose tables are quiet while the rest of the publisher is busy, never holds WAL back.
"""

from __future__ import annotations

import codecs
import logging
import time
from dataclasses import dataclass, field, fields

import psycopg
import pyarrow as pa
from psycopg import sql

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.change_log.identity import LogNeeds, ServerOrigin
from airflow_provider_rowfilter.change_log.log import ChangeLog, ChangeLogError
from airflow_provider_rowfilter.change_log.segment_schema import KINDS
from airflow_provider_rowfilter.change_log.segment_writer import DEFAULT_ROW_GROUP_ROWS, Hold, SegmentWriter
from airflow_provider_rowfilter.change_log.store import open_change_log
from airflow_provider_rowfilter.connection import connect, primary_message
from airflow_provider_rowfilter.core.apply.plan import DEFAULT_MAX_CHANGES
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.pgoutput import PgOutputError
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.publisher import pgoutput_columns
from airflow_provider_rowfilter.publisher.capture_objects import (
    CaptureError,
    SlotMissingError,
    capture_names,
    capture_publications,
    invalidated_error,
)
from airflow_provider_rowfilter.publisher.change_reader import Batch, ChangeReader, TypeNames
from airflow_provider_rowfilter.publisher.failover import ORIGIN_COLUMNS, check_lineage, origin_of
from airflow_provider_rowfilter.publisher.slot_health import WAL_END, WAL_NOW, read_retention, read_slot
from airflow_provider_rowfilter.publisher.writer_lock import writer_lock

log = logging.getLogger(__name__)

DEFAULT_FETCH_ROWS = 10_000
PROTO_VERSION = "1"

_PEEK = ("SELECT (lsn - '0/0'::pg_lsn)::bigint, data FROM pg_logical_slot_peek_binary_changes("
         "%s, %s::pg_lsn, %s, 'proto_version', %s, 'publication_names', %s{origin})")
# The SQL interface runs the output functions in our session, so its settings shape the text form of
# dates, times, intervals, floats and bytea. Pinned to what a native subscriber's walsender uses
# (libpqwalreceiver sends the first three), plus hex bytea and UTC, so the log never depends on the
# role's or database's defaults.
_SESSION = ("SET DateStyle = 'ISO, MDY'", "SET IntervalStyle = 'postgres'", "SET extra_float_digits = 3",
            "SET bytea_output = 'hex'", "SET TimeZone = 'UTC'")


@dataclass
class CaptureResult:
    """What one capture did; printed as the job's JSON summary line."""

    subscription: str
    slot: str
    start_lsn: str  # the slot's confirmed position before the batch (exclusive), after any recovery
    end_lsn: str  # the slot's confirmed position after it (inclusive)
    segment: str | None = None
    transactions: int = 0
    changes: int = 0
    changes_by_kind: dict[str, int] = field(default_factory=dict)
    messages: int = 0  # rows read from the slot (changes plus Begin/Commit/Relation/… messages)
    more: bool = False  # the bound cut the batch: more changes may be waiting
    heartbeat: bool = False  # the slot moved on although nothing was for us
    filtering: str | None = None  # source or spark: who evaluated the publications (core/spec/subscription.py)
    decoder: str = pgoutput_columns.DECODER  # native (the C extension) or numpy (publisher/pgoutput_columns.py)
    recovered_lsn: str | None = None  # an interrupted batch finished: the slot caught up with the log
    lag_bytes: int | None = None  # pg_current_wal_lsn() - end_lsn
    lag_seconds: float | None = None  # now - commit time of the last transaction captured
    seconds: float = 0.0
    changes_per_second: float | None = None
    #: the segment's rows in memory, exactly those of the file published (change_log/segment_writer.py ``Hold``),
    #: when the capture was asked to hold them and the segment is small enough; not part of the summary
    held: pa.Table | None = field(default=None, repr=False, compare=False)

    def summary(self) -> dict:
        return {f.name: getattr(self, f.name) if f.name != "changes_by_kind" else dict(self.changes_by_kind)
                for f in fields(self) if f.name != "held"}


def capture(spec: SubscriptionSpec, *, max_changes: int = DEFAULT_MAX_CHANGES, upto_lsn: str | None = None,
            row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, fetch_rows: int = DEFAULT_FETCH_ROWS,
            needs: LogNeeds | None = None, hold: Hold | None = None) -> CaptureResult:
    """Capture one bounded batch of the subscription's slot into its change log.

    :param max_changes: the batch ends at the first commit at which the slot has returned this many
        rows (PostgreSQL's ``upto_nchanges``: changes plus the Begin, Commit and Relation messages
        around them), so it always holds whole transactions.
    :param upto_lsn: also end the batch at the first commit at or past this position.
    :param row_group_rows: changes per Parquet row group (what the driver holds at once).
    :param fetch_rows: slot rows fetched from the server-side cursor at once.
    :param needs: what the subscriber needs of the log (subscriber/state.py ``StateStore.log_needs``); see
        :func:`_check_log`.
    :param hold: keep the segment's rows (those columns) in memory too, for a reducer of this process
        (``result.held``); only for a segment the publisher filtered (``filtering: source``), whose reduction
        runs here (flows/apply/reducers.py).
    :raises ChangeLogError: the log misses changes the subscriber needs; nothing was read or advanced.
    """
    if max_changes < 1:
        raise CaptureError(f"max_changes={max_changes!r} must be at least 1")
    upto = None if upto_lsn is None else parse_lsn(upto_lsn)
    began = time.monotonic()
    slot = capture_names(spec.subscription)[0]
    change_log = open_change_log(spec)
    with writer_lock(spec) as lock, change_log.writing(), connect(spec.publisher, "publisher", spec) as pub:
        pub.execute(session_settings(spec, pub.info.server_version))
        confirmed, synced, origin = _confirmed_position(pub, slot, needs)
        result = CaptureResult(spec.subscription, slot, format_lsn(confirmed), format_lsn(confirmed))
        logged = change_log.captured_through()
        check_lineage(spec, slot, change_log.last_origin(), origin, logged=logged, confirmed=confirmed,
                      synced=synced, needs=needs)
        _check_log(change_log, slot, confirmed, logged, needs)
        if logged is not None and logged > confirmed:
            # The last run made its segment durable and stopped before advancing the slot.
            _advance(pub, slot, logged)
            log.info("finished the interrupted batch of %s: slot advanced to the log's end %s",
                     slot, format_lsn(logged))
            confirmed = logged
            result.recovered_lsn = result.start_lsn = format_lsn(logged)
        flushed = parse_lsn(pub.execute(f"SELECT {WAL_END}::text").fetchone()[0])
        mode = spec.filtering_mode(pub.info.server_version)
        origin_option = spec.origin_option(pub.info.server_version)
        names = _publication_names(pub, spec, mode)
        writer = SegmentWriter(change_log, confirmed, row_group_rows=row_group_rows, metadata={
            "subscription": spec.subscription, "slot": slot, "publication": ",".join(names), "filtering": mode,
            "publisher": origin.as_dict()}, hold=hold if mode == "source" else None)
        result.filtering = mode
        try:
            batch = _read_slot(pub, writer, slot, ",".join(_quoted(n) for n in names), max_changes=max_changes,
                               upto_lsn=upto, fetch_rows=fetch_rows, mode=mode, needs=needs, origin=origin_option)
            result.more = batch.messages >= max_changes
            target = max(batch.end_lsn or confirmed, confirmed)
            if not result.more:
                # Decoding went through everything flushed before the read: nothing more there is ours.
                complete = flushed if upto is None else min(flushed, upto)
                target = max(target, complete)
            lock.check()  # still the one writer: nothing durable yet
            segment = writer.finish(target)
        except BaseException:
            writer.abort()
            raise
        faults.point("capture-after-segment")
        if target > confirmed:
            lock.check()
            if change_log.identity() is None:
                change_log.record_position(target, slot)  # a new log: its id (the segment records the end)
            _advance(pub, slot, target)
        result.end_lsn = format_lsn(target)
        result.segment = str(segment.path) if segment else None
        result.held = writer.held if segment else None
        result.transactions = writer.transactions
        result.changes = writer.rows
        result.changes_by_kind = {KINDS[k]: n for k, n in sorted(batch.kinds.items())}
        result.messages = batch.messages
        result.heartbeat = writer.rows == 0 and target > confirmed
        now, current = pub.execute(f"SELECT clock_timestamp(), {WAL_NOW} - %s::pg_lsn",
                                   (result.end_lsn,)).fetchone()
        result.lag_bytes = max(int(current), 0)
        if not result.more and (upto is None or upto >= flushed):
            # Every transaction committed before the read is in the log: none waits, so the batch is not behind
            # in time, however long ago the publisher last committed (an idle publisher is no lag).
            result.lag_seconds = 0.0
        elif batch.last_commit_ts is not None:
            # Cut by the bound: the transactions after the last one captured wait, committed since it at the most.
            result.lag_seconds = max((now - batch.last_commit_ts).total_seconds(), 0.0)
    result.seconds = round(time.monotonic() - began, 3)
    if result.changes and result.seconds:
        result.changes_per_second = round(result.changes / result.seconds, 1)
    log.info("captured %d changes in %d transactions from %s (%s, %s], segment %s, lag %s bytes",
             result.changes, result.transactions, slot, result.start_lsn, result.end_lsn, result.segment,
             result.lag_bytes)
    return result


def _publication_names(pub: psycopg.Connection, spec: SubscriptionSpec, mode: str) -> list[str]:
    """What the slot is read through: the subscription's own publications (``source``: pgoutput filters,
    projects and transforms as for a native subscriber), or every capture publication of ours (``spark``:
    pgoutput ORs their actions per table; the main one when none exists, so that the slot's error names it)."""
    if mode == "source":
        return list(spec.publications)
    return capture_publications(pub, spec.subscription) or [capture_names(spec.subscription)[1]]


def _quoted(name: str) -> str:
    """A name in ``publication_names``, which pgoutput splits as an identifier list (SplitIdentifierString)."""
    return '"' + name.replace('"', '""') + '"'


def _check_log(change_log: ChangeLog, slot: str, confirmed: int, logged: int | None, needs: LogNeeds | None) -> None:
    """Refuse, before the slot is read or moved, a log that misses what the subscriber needs.

    The log must be continuous (:meth:`ChangeLog.continuous`) from the lowest position a table
    needs through the slot's position and the log's own end: the capture then writes ``(slot,
    target]`` and the log stays whole. When no table needs anything yet (``needs.since`` None) or
    the tables are past the slot, only the stretch the recovery of an interrupted batch would skip
    must be there. Without a subscriber (``needs`` None, the capture job of a spec without one) the
    log may not be behind the slot: the old rule, plus the chain.
    """
    if needs is None:
        since = confirmed if logged is None else min(logged, confirmed)
    else:
        since = confirmed if needs.since is None else needs.since
    try:
        change_log.continuous(since, confirmed, needs)
    except ChangeLogError as e:
        if logged is None or logged < confirmed:
            e.detail = (f'replication slot "{slot}" is at {format_lsn(confirmed)}, past the end of this log ('
                        f'{"empty" if logged is None else format_lsn(logged)}): another log holds the changes in '
                        "between, or something else consumed the slot, or it was dropped and recreated. " + e.detail)
        raise


def _read_slot(pub: psycopg.Connection, writer: SegmentWriter, slot: str, publication_names: str, *,
               max_changes: int, upto_lsn: int | None, fetch_rows: int, mode: str = "spark",
               needs: LogNeeds | None = None, origin: str | None = None) -> Batch:
    """Stream the slot's pending transactions into ``writer``, a fetch at a time; ``origin`` is pgoutput's option
    (None: not sent, a publisher before 16)."""
    reader = ChangeReader(writer, TypeNames(pub), _python_encoding(pub))
    try:
        with pub.transaction(), pub.cursor("rowfilter_capture", binary=True) as cursor:
            cursor.execute(_PEEK.format(origin="" if origin is None else ", 'origin', %s"),
                           (slot, None if upto_lsn is None else format_lsn(upto_lsn), max_changes, PROTO_VERSION,
                            publication_names, *(() if origin is None else (origin,))))
            while rows := cursor.fetchmany(fetch_rows):
                reader.read(rows)
    except psycopg.Error as e:
        if e.sqlstate == "55000" and not pub.broken:
            # "can no longer access replication slot": invalidated (between our look and the read); name the cause.
            _, found = read_slot(pub, slot)
            if found.lost:
                raise invalidated_error(found, read_retention(pub), _stranded(needs)) from e
        if mode == "source" and e.sqlstate == "42704":  # undefined_object: publication "p" does not exist
            # pgoutput reads each publication as of each change's position (LoadPublications in pgoutput.c):
            # before PostgreSQL 18, one created after changes the slot still holds fails them, as it fails a
            # native subscription's walsender.
            raise CaptureError(
                f'cannot read replication slot "{slot}" through publications {publication_names}: '
                f"{primary_message(e)}",
                detail="filtering: source reads the slot through the subscription's own publications, as of each "
                "change's position; a publication created (or recreated) after changes the slot holds cannot "
                "decode them before PostgreSQL 18, for a native subscription too",
                hint="create the publication before the changes it must carry; to get past changes made before it, "
                "apply until caught up otherwise (filtering: spark), or drop the slot and run `rowfilter refresh "
                "--recreate-slot`; a slot is read by one process at a time") from e
        if pub.broken or isinstance(e, psycopg.OperationalError) and not e.sqlstate or \
                (e.sqlstate or "")[:2] in ("08", "57"):
            # The publisher went away under the read (a crash, a shutdown, a failover): the slot is not in
            # question, and a refresh would not help; nothing was captured or advanced.
            raise CaptureError(
                f'the publisher went away while replication slot "{slot}" was read: {primary_message(e)}',
                detail="nothing was captured, and the slot was not advanced",
                hint="the next run goes on from where this one started, once the publisher answers again; after a "
                "failover, point the spec's publisher at the promoted standby (both servers in one URL with "
                "target_session_attrs=read-write follow a promotion: docs/failover.md)") from e
        raise CaptureError(f'cannot read replication slot "{slot}": {primary_message(e)}',
                           hint="run refresh to (re)create the slot and the capture publication; a slot is "
                           "read by one process at a time") from e
    if reader.txn is not None:
        raise PgOutputError(f"the slot's output ended inside transaction {reader.txn[2]}")
    return reader.batch


def _confirmed_position(pub: psycopg.Connection, slot: str, needs: LogNeeds | None
                        ) -> tuple[int, bool | None, ServerOrigin]:
    """The slot's confirmed position, its ``synced`` flag, and which server this is (publisher/failover.py), in one
    query; refused when the slot is missing, not ours, or invalidated (naming the cause PostgreSQL records:
    core/slot_retention.py)."""
    version = pub.info.server_version
    lost = ("s.invalidation_reason IS NOT NULL" if version >= 170000 else "s.conflicting" if version >= 160000
            else "false") + (" OR s.wal_status = 'lost'" if version >= 130000 else "")
    row = pub.execute(
        f"""SELECT s.slot_name IS NOT NULL, s.plugin, s.database, s.confirmed_flush_lsn::text,
                   {"s.synced" if version >= 170000 else "NULL::bool"}, coalesce({lost}, false), {ORIGIN_COLUMNS}
            FROM pg_control_system() LEFT JOIN pg_replication_slots s ON s.slot_name = %s""", (slot,)).fetchone()
    exists, plugin, database, confirmed, synced, invalidated, system, walfile = row
    if not exists:
        raise SlotMissingError(slot)
    if plugin != "pgoutput" or database != pub.info.dbname:
        raise CaptureError(f'replication slot "{slot}" uses plugin {plugin!r} in database {database!r}',
                           hint="it is not ours; drop it or choose another subscription name")
    if invalidated:
        _, found = read_slot(pub, slot)
        raise invalidated_error(found, read_retention(pub), _stranded(needs))
    return parse_lsn(confirmed), synced, origin_of(system, walfile)


def _stranded(needs: LogNeeds | None) -> list[tuple[str, str | None]]:
    """The tables whose changes an invalidated slot no longer gives (those holding a position)."""
    return [(t, format_lsn(p)) for t, p in (needs.tables if needs else ())]


def _advance(pub: psycopg.Connection, slot: str, lsn: int) -> None:
    """Confirm everything through ``lsn`` to the slot (called only once the log holds it durably)."""
    try:
        pub.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, format_lsn(lsn)))
    except psycopg.Error as e:
        raise CaptureError(f'cannot advance replication slot "{slot}" to {format_lsn(lsn)}: {primary_message(e)}',
                           hint="the change log is durable; rerunning the capture finishes the advance") from e


def session_settings(spec: SubscriptionSpec, server_version: int) -> sql.Composable:
    """What the capture's session sets first: the text forms its decoder reads, and the spec's
    ``logical_decoding_work_mem`` when given (the session's own, which the slot function's decoding and
    the slot's advance use: reorderbuffer.c ``ReorderBufferCheckMemoryLimit``)."""
    statements = [sql.SQL(s) for s in _SESSION]
    kb = spec.decoding_work_mem_kb
    if kb is not None:
        if server_version < 130000:  # the setting exists from PostgreSQL 13 (before it, a fixed 4096 changes)
            raise CaptureError(
                f"subscription {spec.subscription}: logical_decoding_work_mem is a setting of PostgreSQL 13 and later; "
                f"the publisher is {server_version // 10000}",
                hint="remove logical_decoding_work_mem from the spec for this publisher")
        statements.append(sql.SQL("SET logical_decoding_work_mem = {}").format(sql.Literal(f"{kb}kB")))
    return sql.SQL("; ").join(statements)


def _python_encoding(pub: psycopg.Connection) -> str:
    """The Python codec of the publisher's server encoding (pgoutput sends text values in it)."""
    name = pub.execute("SHOW server_encoding").fetchone()[0]
    if name == "SQL_ASCII":
        raise CaptureError("the publisher's server_encoding is SQL_ASCII: its text values have no known encoding",
                           hint="use a publisher database with a real encoding (UTF8)")
    candidate = {"UTF8": "utf-8"}.get(name) or (f"cp{name[3:]}" if name.startswith("WIN") else name)
    try:
        return codecs.lookup(candidate).name
    except LookupError:
        raise CaptureError(f"the publisher's server_encoding {name!r} has no Python codec",
                           hint="use a UTF8 publisher database") from None

