"""The durable change log: Parquet segments of whole source transactions, and the capture position.

A segment holds every change of the capture publication whose transaction's commit record ends in
``(start, end]``; its file name is that range, ``<start>-<end>.parquet`` with each LSN as 16
zero-padded hexadecimal digits, so names sort in LSN order and a rerun of the same range writes
the same name. Every advance of the slot leaves a segment, an empty one when nothing in the range
was ours, so consecutive segments chain (``next.start == previous.end``) and the names alone prove
the log is continuous (:meth:`ChangeLog.continuous`). ``_position.json`` records the log's
identity (a uuid made when the log is first written); the newest segment, which the apply never
prunes, records where the log ends (``captured_through``). Segments are written under a
temporary name, fsynced, renamed and the directory fsynced; only then may the slot be advanced
(docs/change-log.md). Names starting with ``.`` or ``_`` are invisible to Spark's Parquet reader,
so the directory can be read whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.change_log.identity import LogIdentity, LogNeeds, ServerOrigin
from airflow_provider_rowfilter.core.apply_plan import IdentitySpan, RelationSpan
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.private_files import (
    create_private,
    group_mode,
    open_private,
    private_directory,
    write_private,
)

FORMAT_VERSION = 1  # of a segment
POSITION_FORMAT_VERSION = 2  # of the position file: 2 added the log's id
METADATA_KEY = "rowfilter.change_log"
POSITION_FILE = "_position.json"
LOCK_FILE = ".lock"
TEMP_PREFIX = ".tmp-"
DEFAULT_ROW_GROUP_ROWS = 10_000
_SEGMENT = re.compile(r"^([0-9A-F]{16})-([0-9A-F]{16})\.parquet$")

# The order of these lists is the order of the codes kept per row; never reorder, only append.
KINDS = ("insert", "update", "delete", "truncate")
INSERT, UPDATE, DELETE, TRUNCATE = range(4)
OLD_KINDS = ("K", "O")

_TEXTS = pa.list_(pa.string())
_FLAGS = pa.list_(pa.bool_())


def _field(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


SCHEMA = pa.schema([
    _field("commit_lsn", pa.int64(), "LSN of the transaction's commit record (Begin final_lsn)", False),
    _field("commit_ts", pa.timestamp("us", tz="UTC"), "commit time on the publisher", False),
    _field("xid", pa.int64(), "publisher transaction id", False),
    _field("origin", pa.string(), "replication origin of the transaction, NULL when none"),
    _field("seq", pa.int32(), "order of the change within its transaction, from 0", False),
    _field("lsn", pa.int64(), "LSN of the change", False),
    _field("kind", pa.string(), "insert, update, delete or truncate", False),
    _field("relation_oid", pa.int64(), "pg_class OID of the (leaf) table on the publisher", False),
    _field("schema", pa.string(), "schema of the table", False),
    _field("table", pa.string(), "name of the (leaf) table", False),
    _field("replica_identity", pa.string(), "relreplident: d default, n nothing, f full, i index", False),
    _field("column_names", _TEXTS, "the relation's columns, in the order of the value lists", False),
    _field("column_types", _TEXTS, "format_type(type_oid, typmod) of each column", False),
    _field("column_type_oids", pa.list_(pa.int64()), "type OID of each column", False),
    _field("column_typmods", pa.list_(pa.int32()), "typmod of each column (-1: none)", False),
    _field("key_columns", _FLAGS, "whether each column is part of the replica identity key", False),
    _field("new_values", _TEXTS, "new row, PostgreSQL text form per column (NULL list: no new row)"),
    _field("new_unchanged", _FLAGS, "per column: unchanged TOASTed value not sent (its value is NULL)"),
    _field("old_kind", pa.string(), "K: old key only (other columns NULL), O: old full row, NULL: none"),
    _field("old_values", _TEXTS, "old key or old row, PostgreSQL text form per column"),
    _field("old_unchanged", _FLAGS, "per column of the old row: unchanged TOASTed value not sent"),
    _field("truncate_cascade", pa.bool_(), "TRUNCATE … CASCADE (truncate rows only)"),
    _field("truncate_restart_identity", pa.bool_(), "TRUNCATE … RESTART IDENTITY (truncate rows only)"),
])


class ChangeLogError(RowFilterError):
    """The change-log directory cannot be used: locked, unwritable, or inconsistent with the slot."""


@dataclass(frozen=True)
class Segment:
    """One segment file and the LSN range it covers (start exclusive, end inclusive)."""

    path: Path
    start_lsn: int
    end_lsn: int


@dataclass(frozen=True)
class LoggedRelation:
    """A relation as announced by pgoutput, with its type names resolved, as each row repeats it."""

    oid: int
    schema: str
    table: str
    replica_identity: str
    column_names: tuple[str, ...]
    column_types: tuple[str, ...]
    column_type_oids: tuple[int, ...]
    column_typmods: tuple[int, ...]
    key_columns: tuple[bool, ...]


def segment_name(start_lsn: int, end_lsn: int) -> str:
    return f"{start_lsn:016X}-{end_lsn:016X}.parquet"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    match = _SEGMENT.match(name)
    return None if match is None else (int(match.group(1), 16), int(match.group(2), 16))


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(temp: Path, final: Path) -> None:
    """Make ``temp`` durable under the name ``final``: fsync the file, rename, fsync the directory."""
    fsync_file(temp)
    os.replace(temp, final)
    fsync_directory(final.parent)


class ChangeLog:
    """A change-log directory: its segments, its capture position, and the lock of the one writer."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def segments(self) -> list[Segment]:
        """Every segment, in LSN order."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in os.scandir(self.directory):
            lsns = parse_segment_name(entry.name)
            if lsns is not None:
                found.append(Segment(Path(entry.path), *lsns))
        return sorted(found, key=lambda s: (s.start_lsn, s.end_lsn))

    def captured_through(self) -> int | None:
        """The end of the last segment written, or None when nothing was ever captured.

        The newest segment's name records it (the apply never prunes the newest); the position file
        holds the end of the first capture, and of whatever an older version of this code wrote there.
        """
        ends = [s.end_lsn for s in self.segments()]
        position = self._position()
        if position is not None:
            ends.append(position["captured_through"])
        return max(ends, default=None)

    def last_origin(self) -> ServerOrigin | None:
        """Which server the newest segment was captured from (its metadata's ``publisher``); None before any,
        or for a segment written before the metadata recorded it."""
        segments = self.segments()
        if not segments:
            return None
        raw = (pq.read_metadata(segments[-1].path).metadata or {}).get(METADATA_KEY.encode())
        return ServerOrigin.from_dict(json.loads(raw).get("publisher") if raw else None)

    def identity(self) -> LogIdentity | None:
        """This log's id (made by the first :meth:`record_position`) and where it is read; None before."""
        position = self._position()
        if position is None or "id" not in position:
            return None
        return LogIdentity(position["id"], socket.gethostname(), str(self.directory.resolve()))

    def _position(self) -> dict | None:
        path = self.directory / POSITION_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
            position = {"captured_through": parse_lsn(data["captured_through"])}
            if "id" in data:
                position["id"] = str(uuid.UUID(data["id"]))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ChangeLogError(f"the change-log position file {str(path)!r} is unreadable: {e}",
                                 hint="restore it from a backup of the log; nothing was captured or applied") from e
        return position

    def continuous(self, since: int, through: int, needs: LogNeeds | None = None) -> list[Segment]:
        """The segments past ``since``, proven to chain from ``since`` to ``through`` and to the log's end.

        The rule: the segments ending past ``since`` chain exactly (each starts where the previous
        one ended), the first starts at or before ``since``, and the last reaches ``through`` and
        ``captured_through`` (a position file ahead of every segment means the last one is gone).
        Segments ending at or before ``since`` may be gone (the apply prunes them); when ``since``
        is at or past both ends, nothing is needed. Every advance of the slot leaves a segment, an
        empty one for a heartbeat, so a hole in the names is a lost segment, never a quiet period.

        :raises ChangeLogError: naming the missing range, this log, and the fix; nothing was changed.
        """
        end = max(through, self.captured_through() or through)
        reached, found = since, []
        for segment in self.segments():
            if segment.end_lsn <= since:
                continue
            if segment.start_lsn > reached:
                raise self._gap(since, end, reached, segment.start_lsn, needs,
                                f"the next segment is {segment.path.name}")
            if found and segment.start_lsn < reached:
                raise ChangeLogError(
                    f"the change-log segments {found[-1].path.name} and {segment.path.name} overlap",
                    detail=f"change log {str(self.directory)!r}: segments of another log were copied into it",
                    hint="remove the segments that do not belong to this log (compare their rowfilter.change_log "
                    "metadata: subscription, slot); nothing was captured or applied")
            found.append(segment)
            reached = segment.end_lsn
        if reached < end:
            last = f"the last segment is {found[-1].path.name}" if found else "no segment ends past the start"
            raise self._gap(since, end, reached, end, needs, last)
        return found

    def _gap(self, since: int, end: int, gap_from: int, gap_to: int, needs: LogNeeds | None,
             found: str) -> ChangeLogError:
        where = str(self.directory)
        detail = (f"The log must be continuous from {format_lsn(since)} to {format_lsn(end)}; {found}. Nothing was "
                  "captured, applied or advanced")
        affected = [t for t, position in (needs.tables if needs else ()) if position < gap_to]
        resync = (f"resync the tables that need them ({', '.join(affected)}) with `rowfilter resync --table T --copy`"
                  if affected else "resync the affected tables with `rowfilter resync --table T --copy`")
        recorded = needs.recorded if needs else None
        if needs is not None and recorded is not None and not self.is_at(recorded):
            here = where if recorded.host == socket.gethostname() else f"{socket.gethostname()}:{where}"
            return ChangeLogError(
                f"subscription {needs.subscription}'s change log is at {recorded.location} (id {recorded.id}); "
                f"this run reads {here}: set change_log in the spec to that directory",
                detail=f"{where} is missing the changes from {format_lsn(gap_from)} to {format_lsn(gap_to)}: "
                + detail, hint=f"point change_log at {recorded.path}; if that log is lost, {resync}")
        current = self.identity()
        if recorded is not None and (current is None or current.id != recorded.id):
            detail += (f". The log at this path was replaced: the subscription recorded id {recorded.id}, "
                       f"this one is {'new' if current is None else current.id}")
        return ChangeLogError(
            f"the change log {where!r} is missing the changes from {format_lsn(gap_from)} to {format_lsn(gap_to)}",
            detail=detail, hint=f"restore the missing segments into {where}, or set change_log in the spec to the "
            f"directory that holds them; otherwise {resync}")

    def is_at(self, identity: LogIdentity) -> bool:
        """Whether ``identity`` was recorded at this directory on this host."""
        return (identity.host, identity.path) == (socket.gethostname(), str(self.directory.resolve()))

    def set_aside(self) -> Path | None:
        """Move a log that belongs to an earlier slot out of the way (its positions mean nothing to a new slot).

        Returns where it went, or None when there was nothing to move. Called when refresh creates the slot.
        """
        return self._move_aside("replaced")

    def retire(self) -> Path | None:
        """``rowfilter drop``: move the log aside as ``<directory>.dropped-<time>``, never deleting a segment.

        Returns where it went; None when nothing was ever captured, and then an empty directory (or
        one holding only the lock file) is removed. Call it holding :meth:`locked`.
        """
        if not self.directory.is_dir():
            return None
        aside = self._move_aside("dropped")
        if aside is None and {e.name for e in os.scandir(self.directory)} <= {LOCK_FILE}:
            with contextlib.suppress(FileNotFoundError):
                (self.directory / LOCK_FILE).unlink()
            self.directory.rmdir()
            fsync_directory(self.directory.parent)
        return aside

    def _move_aside(self, label: str) -> Path | None:
        if not self.segments() and not (self.directory / POSITION_FILE).exists():
            return None
        stem = f"{self.directory.name}.{label}-{int(time.time())}"
        aside = self.directory.with_name(stem)
        n = 0
        while aside.exists():
            n += 1
            aside = self.directory.with_name(f"{stem}-{n}")
        os.replace(self.directory, aside)
        fsync_directory(self.directory.parent)
        return aside

    def record_position(self, lsn: int, slot: str) -> None:
        """Durably record that the log is complete through ``lsn`` (before the slot is advanced there).

        The first record gives the log its id; later ones keep it.
        """
        position = self._position() or {}
        temp = self.directory / f"{TEMP_PREFIX}{POSITION_FILE}"
        write_private(temp, json.dumps({"format_version": POSITION_FORMAT_VERSION, "captured_through": format_lsn(lsn),
                                        "id": position.get("id") or str(uuid.uuid4()), "slot": slot},
                                       sort_keys=True) + "\n", mode=group_mode(self.directory))
        publish(temp, self.directory / POSITION_FILE)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's writer lock; remove what a crashed writer left behind."""
        self._make_directory()
        with open_private(self.directory / LOCK_FILE, "a+", mode=group_mode(self.directory)) as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as e:
                raise ChangeLogError(f"another capture holds the change log {str(self.directory)!r}",
                                     hint="let it finish; captures of one subscription run one at a time") from e
            try:
                for entry in os.scandir(self.directory):
                    if entry.name.startswith(TEMP_PREFIX):
                        os.unlink(entry.path)
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _make_directory(self) -> None:
        try:
            missing = private_directory(self.directory)  # 0700: the segments hold replicated rows
        except OSError as e:
            raise ChangeLogError(f"cannot create the change-log directory {str(self.directory)!r}: {e}",
                                 hint="set change_log in the spec to a writable directory") from e
        for created in missing:
            fsync_directory(created.parent)


@dataclass(frozen=True)
class ChangeRows:
    """Changes as columns, ready to become a piece of a segment (:meth:`SegmentWriter.append`).

    Rows name their transaction and relation by index into ``txns`` (commit LSNs, commit times in
    Unix microseconds, xids, origins) and ``relations``; the repeated columns are built with ``take``.
    ``old_kind`` and ``truncate`` are -1 where a row has none; ``new`` and ``old`` are the images as
    ``(values, unchanged)`` list arrays (publisher/image_arrays.py).
    """

    txns: Sequence[Sequence]
    txn: Sequence[int]
    relations: Sequence[LoggedRelation]
    rel: Sequence[int]
    seq: Sequence[int]
    lsn: Sequence[int]
    kind: Sequence[int]
    old_kind: Sequence[int]
    truncate: Sequence[int]
    new: tuple[pa.Array, pa.Array]
    old: tuple[pa.Array, pa.Array]

    @property
    def count(self) -> int:
        return len(self.seq)

    def table(self) -> pa.Table:
        txn = pa.array(self.txn, pa.int32())
        rel = pa.array(self.rel, pa.int32())
        rels = self.relations
        old_kind = pa.array(self.old_kind, pa.int8())
        truncate = pa.array(self.truncate, pa.int16())
        none = pc.equal(truncate, -1)
        columns = {
            "commit_lsn": pa.array(self.txns[0], pa.int64()).take(txn),
            "commit_ts": pa.array(self.txns[1], pa.int64()).take(txn).cast(pa.timestamp("us", tz="UTC")),
            "xid": pa.array(self.txns[2], pa.int64()).take(txn),
            "origin": pa.array(self.txns[3], pa.string()).take(txn),
            "seq": pa.array(self.seq, pa.int32()),
            "lsn": pa.array(self.lsn, pa.int64()),
            "kind": pa.array(KINDS, pa.string()).take(pa.array(self.kind, pa.int8())),
            "relation_oid": pa.array([r.oid for r in rels], pa.int64()).take(rel),
            "schema": pa.array([r.schema for r in rels], pa.string()).take(rel),
            "table": pa.array([r.table for r in rels], pa.string()).take(rel),
            "replica_identity": pa.array([r.replica_identity for r in rels], pa.string()).take(rel),
            "column_names": pa.array([r.column_names for r in rels], _TEXTS).take(rel),
            "column_types": pa.array([r.column_types for r in rels], _TEXTS).take(rel),
            "column_type_oids": pa.array([r.column_type_oids for r in rels], pa.list_(pa.int64())).take(rel),
            "column_typmods": pa.array([r.column_typmods for r in rels], pa.list_(pa.int32())).take(rel),
            "key_columns": pa.array([r.key_columns for r in rels], _FLAGS).take(rel),
            "new_values": self.new[0],
            "new_unchanged": self.new[1],
            "old_kind": pa.array(OLD_KINDS, pa.string()).take(pc.if_else(pc.equal(old_kind, -1), None, old_kind)),
            "old_values": self.old[0],
            "old_unchanged": self.old[1],
            "truncate_cascade": pc.if_else(none, None, pc.not_equal(pc.bit_wise_and(truncate, 1), 0)),
            "truncate_restart_identity": pc.if_else(none, None, pc.not_equal(pc.bit_wise_and(truncate, 2), 0)),
        }
        return pa.Table.from_arrays([columns[f.name] for f in SCHEMA], schema=SCHEMA)

    def spans(self) -> list[RelationSpan]:
        """Each relation these rows use, with the first and last commit LSN and the first change LSN it appears at."""
        rel = np.asarray(self.rel, np.int64)
        if not len(rel):
            return []
        commit = np.asarray(self.txns[0], np.int64)[np.asarray(self.txn, np.int64)]
        lsn = np.asarray(self.lsn, np.int64)
        spans = []
        for index in np.unique(rel).tolist():
            mine = rel == index
            r = self.relations[index]
            spans.append(RelationSpan(r.oid, r.schema, r.table, r.column_names, r.column_types,
                                      int(commit[mine].min()), int(commit[mine].max()), int(lsn[mine].min())))
        return spans


class SegmentWriter:
    """Write one segment, a row group every ``row_group_rows`` changes so memory stays flat.

    Changes come as :class:`ChangeRows` of whole fetches, in slot order (:meth:`append`); the
    capture counts the transactions they complete (:meth:`end_transactions`) and checks that the
    slot's output ends at a commit (publisher/capture.py ``_read_slot``).
    """

    def __init__(self, log: ChangeLog, start_lsn: int, *, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
                 metadata: dict[str, str] | None = None) -> None:
        if row_group_rows < 1:
            raise ChangeLogError(f"row_group_rows={row_group_rows!r} must be at least 1")
        self.log = log
        self.start_lsn = start_lsn
        self.row_group_rows = row_group_rows
        self.metadata = dict(metadata or {})
        self.rows = 0
        self.transactions = 0
        self.temp = log.directory / f"{TEMP_PREFIX}{start_lsn:016X}-{os.getpid()}.parquet"
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []  # changes not yet written, in order
        self._pending_rows = 0
        self._spans: dict[tuple, RelationSpan] = {}  # the relations the segment holds (its metadata)

    def append(self, rows: ChangeRows) -> None:
        """Append a fetch's changes (see :class:`ChangeRows`); full row groups are written at once."""
        self._pending.append(rows.table())
        self._note_relations(rows)
        self._pending_rows += rows.count
        self.rows += rows.count
        if self._pending_rows >= self.row_group_rows:
            self._write(final=False)

    def end_transactions(self, count: int) -> None:
        """Count ``count`` more whole transactions among the appended changes (those with any change)."""
        self.transactions += count

    def _note_relations(self, rows: ChangeRows) -> None:
        """Merge the relations of ``rows`` into the segment's (one entry per distinct definition)."""
        for span in rows.spans():
            key = span.definition
            known = self._spans.get(key)
            self._spans[key] = span if known is None else known.merged(span)

    def _write(self, *, final: bool) -> None:
        """Write full row groups of what is waiting (and, when ``final``, the rest)."""
        if not self._pending_rows:
            return
        table = pa.concat_tables(self._pending)
        full = self._pending_rows if final else self._pending_rows - self._pending_rows % self.row_group_rows
        if full == 0:
            return
        if self._writer is None:
            self._writer = self._open()
        self._writer.write_table(table.slice(0, full), row_group_size=self.row_group_rows)
        rest = table.slice(full)
        self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows
        faults.point("capture-mid-read")

    def _open(self) -> pq.ParquetWriter:
        # 0600 (0640 in a directory its owner opened to a group) before a row is in it; Arrow's open truncates
        # and keeps the mode.
        os.close(create_private(self.temp, mode=group_mode(self.log.directory)))
        return pq.ParquetWriter(self.temp, SCHEMA, compression="zstd", write_statistics=True)

    def finish(self, end_lsn: int) -> Segment | None:
        """Flush, close, and durably publish the segment ``(start, end]``; None when the range is empty.

        A range with no change of ours still gets its segment (no row group, the metadata's counts 0):
        the log's names then prove it continuous (:meth:`ChangeLog.continuous`).
        """
        if end_lsn <= self.start_lsn:
            if self.rows:
                raise ChangeLogError(f"a segment of {self.rows} changes cannot end at {format_lsn(end_lsn)}, "
                                     f"at or before its start {format_lsn(self.start_lsn)}")
            self.abort()
            return None
        self._write(final=True)
        if self._writer is None:
            self._writer = self._open()
        self._writer.add_key_value_metadata({METADATA_KEY: json.dumps({
            **self.metadata, "format_version": FORMAT_VERSION, "start_lsn": format_lsn(self.start_lsn),
            "end_lsn": format_lsn(end_lsn), "transactions": self.transactions, "changes": self.rows,
            "relations": [s.to_document() for s in sorted(self._spans.values(), key=lambda s: s.first_lsn)],
        }, sort_keys=True)})
        self._writer.close()
        self._writer = None
        final = self.log.directory / segment_name(self.start_lsn, end_lsn)
        publish(self.temp, final)
        return Segment(final, self.start_lsn, end_lsn)

    def abort(self) -> None:
        """Drop what was written; the temporary file never becomes a segment."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        with contextlib.suppress(FileNotFoundError):
            self.temp.unlink()


def segment_counts(path: str | os.PathLike) -> tuple[int, int]:
    """(transactions, changes) of a segment: its metadata's transactions, the footer's row count."""
    footer = pq.read_metadata(path)
    raw = (footer.metadata or {}).get(METADATA_KEY.encode())
    facts = json.loads(raw) if raw else {}
    return int(facts.get("transactions", 0)), footer.num_rows


def segment_filtering(path: str | os.PathLike) -> str:
    """Who evaluated the publications for a segment's changes: ``source`` (the publisher's pgoutput, through
    the subscription's publications) or ``spark`` (captured unfiltered; also every segment written before the
    metadata recorded it). The apply never mixes the two in one batch (apply/batch_plan.py)."""
    raw = (pq.read_metadata(path).metadata or {}).get(METADATA_KEY.encode())
    return (json.loads(raw) if raw else {}).get("filtering") or "spark"


def segment_relations(path: str | os.PathLike) -> list[RelationSpan]:
    """The relations a segment holds, each with where it first and last appears.

    From the segment's metadata (``relations``); a segment written before the metadata recorded them
    is read for the few columns that say it (row groups of names and LSNs, not the values).
    """
    metadata = pq.read_metadata(path).metadata or {}
    raw = metadata.get(METADATA_KEY.encode())
    facts = json.loads(raw) if raw else {}
    if "relations" in facts:
        return [RelationSpan.from_document(d) for d in facts["relations"]]
    table = pq.read_table(path, columns=["commit_lsn", "lsn", "relation_oid", "schema", "table", "column_names",
                                         "column_types"])
    joined = table.append_column("_names", pc.binary_join(table["column_names"], "\x00")) \
                  .append_column("_types", pc.binary_join(table["column_types"], "\x00"))
    grouped = joined.group_by(["relation_oid", "schema", "table", "_names", "_types"]).aggregate(
        [("commit_lsn", "min"), ("commit_lsn", "max"), ("lsn", "min")])
    return sorted((RelationSpan(r["relation_oid"], r["schema"], r["table"],
                                tuple(r["_names"].split("\x00")) if r["_names"] else (),
                                tuple(r["_types"].split("\x00")) if r["_types"] else (),
                                r["commit_lsn_min"], r["commit_lsn_max"], r["lsn_min"])
                   for r in grouped.to_pylist()), key=lambda s: s.first_lsn)


def read_segments(segments: Sequence[Segment]) -> pa.Table:
    """Read segments into one Arrow table (tests and tools; the apply job reads them with Spark)."""
    if not segments:
        return SCHEMA.empty_table()
    return pa.concat_tables(pq.read_table(s.path, schema=SCHEMA) for s in segments)


def segment_identities(path: str | os.PathLike) -> list[IdentitySpan]:
    """The replica identities the UPDATEs and DELETEs of a segment were logged under (core/apply_plan.py
    ``check_identities``): one entry per table, operation, identity and key, with where it first and last appears.
    Reads the few columns that say it, not the values."""
    table = pq.ParquetFile(path).read(columns=["commit_lsn", "lsn", "kind", "schema", "table", "replica_identity",
                                               "column_names", "key_columns"])
    table = table.filter(pc.is_in(table["kind"], pa.array(["update", "delete"])))
    if not table.num_rows:
        return []
    flags, names = table["key_columns"].combine_chunks(), table["column_names"].combine_chunks()
    offsets = pc.subtract(flags.offsets, flags.offsets[0])
    key_names = pa.ListArray.from_arrays(offsets, pc.if_else(flags.flatten(), names.flatten(), ""))
    joined = pc.binary_join(key_names, "\x00")
    grouped = table.select(["commit_lsn", "lsn", "kind", "schema", "table", "replica_identity"]) \
        .append_column("_key", joined).group_by(["schema", "table", "kind", "replica_identity", "_key"]).aggregate(
            [("commit_lsn", "min"), ("commit_lsn", "max"), ("lsn", "min")])
    return sorted((IdentitySpan(r["schema"], r["table"], r["kind"], r["replica_identity"],
                                tuple(n for n in r["_key"].split("\x00") if n), r["commit_lsn_min"],
                                r["commit_lsn_max"], r["lsn_min"]) for r in grouped.to_pylist()),
                  key=lambda s: s.first_lsn)
