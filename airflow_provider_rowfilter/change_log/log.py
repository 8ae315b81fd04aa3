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
(docs/change-log.md). One writer at a time: the capture holds a lock in the database
(publisher/writer_lock.py), not in the file system. Names starting with ``.`` or ``_`` are invisible to Spark's Parquet reader,
so the directory can be read whole.

A segment's format (its schema, its rows as columns) is change_log/segment_schema.py; it is written by
change_log/segment_writer.py and read by change_log/segment_reader.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_rowfilter.change_log.identity import LogIdentity, LogNeeds, ServerOrigin
from airflow_provider_rowfilter.change_log.segment_reader import read_metadata
from airflow_provider_rowfilter.change_log.segment_schema import METADATA_KEY
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.private_files import (
    group_mode,
    private_directory,
    write_private,
)

POSITION_FORMAT_VERSION = 2  # of the position file: 2 added the log's id
POSITION_FILE = "_position.json"
LOCK_FILE = ".lock"  # the flock of releases before the database held the writer lock: removed when met
TEMP_PREFIX = ".tmp-"
_SEGMENT = re.compile(r"^([0-9A-F]{16})-([0-9A-F]{16})\.parquet$")


class ChangeLogError(RowFilterError):
    """The change log cannot be used: held by another capture, unwritable, or inconsistent with the slot."""


@dataclass(frozen=True)
class Segment:
    """One segment file and the LSN range it covers (start exclusive, end inclusive).

    ``path`` is a local :class:`~pathlib.Path`, or an object's :class:`~airflow_provider_rowfilter.change_log.store.ObjectPath`
    (``str()`` is its URL, ``name`` its file name, ``unlink()`` deletes it).
    """

    path: Path
    start_lsn: int
    end_lsn: int



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
    """A change-log directory: its segments and its capture position (its one writer holds publisher/writer_lock.py)."""

    #: A directory of this host (not an object store's prefix): what change_log/unrecorded.py may clean.
    on_this_host = True

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    @property
    def where(self) -> str:
        """The log's location as messages name it: the directory, or the object store's URL."""
        return str(self.directory)

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
        raw = (read_metadata(segments[-1].path).metadata or {}).get(METADATA_KEY.encode())
        return ServerOrigin.from_dict(json.loads(raw).get("publisher") if raw else None)

    def identity(self) -> LogIdentity | None:
        """This log's id (made by the first :meth:`record_position`) and where it is read; None before."""
        position = self._position()
        if position is None or "id" not in position:
            return None
        return LogIdentity(position["id"], *self._here())

    def _here(self) -> tuple[str, str]:
        """(host, path) a log identity records of this location."""
        return socket.gethostname(), str(self.directory.resolve())

    def _read_position(self) -> str | None:
        try:
            return (self.directory / POSITION_FILE).read_text()
        except FileNotFoundError:
            return None

    def _position(self) -> dict | None:
        path = f"{self.where}/{POSITION_FILE}"
        text = self._read_position()
        if text is None:
            return None
        try:
            data = json.loads(text)
            position = {"captured_through": parse_lsn(data["captured_through"])}
            if "id" in data:
                position["id"] = str(uuid.UUID(data["id"]))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ChangeLogError(f"the change-log position file {path!r} is unreadable: {e}",
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
                    detail=f"change log {self.where!r}: segments of another log were copied into it",
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
        where = self.where
        detail = (f"The log must be continuous from {format_lsn(since)} to {format_lsn(end)}; {found}. Nothing was "
                  "captured, applied or advanced")
        affected = [t for t, position in (needs.tables if needs else ()) if position < gap_to]
        resync = (f"resync the tables that need them ({', '.join(affected)}) with `rowfilter resync --table T --copy`"
                  if affected else "resync the affected tables with `rowfilter resync --table T --copy`")
        recorded = needs.recorded if needs else None
        if needs is not None and recorded is not None and not self.is_at(recorded):
            host = self._here()[0]
            here = where if recorded.host == host or not host else f"{host}:{where}"
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
        """Whether ``identity`` was recorded at this location (this directory on this host, or this URL)."""
        return (identity.host, identity.path) == self._here()

    def set_aside(self) -> Path | None:
        """Move a log that belongs to an earlier slot out of the way (its positions mean nothing to a new slot).

        Returns where it went, or None when there was nothing to move. Called when refresh creates the slot.
        """
        return self._move_aside("replaced")

    def retire(self) -> Path | None:
        """``rowfilter drop``: move the log aside as ``<directory>.dropped-<time>``, never deleting a segment.

        Returns where it went; None when nothing was ever captured, and then an empty directory (or
        one holding only an old release's lock file) is removed. Call it holding the writer lock (publisher/writer_lock.py).
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
        self._write_position(json.dumps({"format_version": POSITION_FORMAT_VERSION, "captured_through": format_lsn(lsn),
                                         "id": position.get("id") or str(uuid.uuid4()), "slot": slot},
                                        sort_keys=True) + "\n")

    def _write_position(self, text: str) -> None:
        temp = self.directory / f"{TEMP_PREFIX}{POSITION_FILE}"
        write_private(temp, text, mode=group_mode(self.directory))
        publish(temp, self.directory / POSITION_FILE)

    def staging_path(self, start_lsn: int) -> Path:
        """Where a segment of ``start_lsn`` is written before :meth:`publish_segment` (private to its owner)."""
        return self.directory / f"{TEMP_PREFIX}{start_lsn:016X}-{os.getpid()}.parquet"

    def staging_mode(self) -> int:
        return group_mode(self.directory)

    def publish_segment(self, staged: Path, start_lsn: int, end_lsn: int) -> Segment:
        """Make the staged file the durable segment ``(start, end]``: fsync, rename, fsync the directory."""
        final = self.directory / segment_name(start_lsn, end_lsn)
        publish(staged, final)
        return Segment(final, start_lsn, end_lsn)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Make the directory; remove what a crashed writer left behind (temporary files, an old release's lock file).

        Call it holding the writer lock (publisher/writer_lock.py): only the one writer may remove a temporary file.
        """
        self._make_directory()
        for entry in os.scandir(self.directory):
            if entry.name.startswith(TEMP_PREFIX) or entry.name == LOCK_FILE:
                os.unlink(entry.path)
        yield

    def _make_directory(self) -> None:
        try:
            missing = private_directory(self.directory)  # 0700: the segments hold replicated rows
        except OSError as e:
            raise ChangeLogError(f"cannot create the change-log directory {str(self.directory)!r}: {e}",
                                 hint="set change_log in the spec to a writable directory") from e
        for created in missing:
            fsync_directory(created.parent)
