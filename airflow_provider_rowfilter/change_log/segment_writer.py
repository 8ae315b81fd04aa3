"""Writing one change-log segment: row groups as fetches arrive, then fsync, rename and fsync (change_log/log.py)."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.change_log.log import ChangeLog, ChangeLogError, Segment
from airflow_provider_rowfilter.change_log.segment_schema import FORMAT_VERSION, METADATA_KEY, SCHEMA, ChangeRows
from airflow_provider_rowfilter.core.apply.relation_checks import RelationSpan
from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.private_files import create_private

DEFAULT_ROW_GROUP_ROWS = 10_000


@dataclass(frozen=True)
class Hold:
    """What a writer keeps of its segment in memory: these columns, while it has at most ``changes`` rows."""

    changes: int
    columns: tuple[str, ...]


class SegmentWriter:
    """Write one segment, a row group every ``row_group_rows`` changes so memory stays flat.

    Changes come as :class:`ChangeRows` of whole fetches, in slot order (:meth:`append`); the
    capture counts the transactions they complete (:meth:`end_transactions`) and checks that the
    slot's output ends at a commit (publisher/capture.py ``_read_slot``).

    ``hold``: also keep the segment's rows in memory (those columns of them), for a reducer in the same process
    to take instead of reading the file back (:attr:`held`); given up, and nothing held, past ``hold.changes``.
    """

    def __init__(self, log: ChangeLog, start_lsn: int, *, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
                 metadata: dict[str, str] | None = None, hold: Hold | None = None) -> None:
        if row_group_rows < 1:
            raise ChangeLogError(f"row_group_rows={row_group_rows!r} must be at least 1")
        self.log = log
        self.start_lsn = start_lsn
        self.row_group_rows = row_group_rows
        self.metadata = dict(metadata or {})
        self.rows = 0
        self.transactions = 0
        self.temp = log.staging_path(start_lsn)
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []  # changes not yet written, in order
        self._pending_rows = 0
        self._spans: dict[tuple, RelationSpan] = {}  # the relations the segment holds (its metadata)
        self._hold = hold
        self._held: list[pa.Table] | None = [] if hold is not None else None  # the rows kept, in order
        self.held: pa.Table | None = None  # after finish: exactly the rows of the segment published, when kept

    def append(self, rows: ChangeRows) -> None:
        """Append a fetch's changes (see :class:`ChangeRows`); full row groups are written at once."""
        table = rows.table()
        self._pending.append(table)
        if self._held is not None and self._hold is not None:
            if self.rows + rows.count > self._hold.changes:
                self._held = None  # too large to keep: the reducer reads the segment back
            else:
                self._held.append(table.select(list(self._hold.columns)))
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
        os.close(create_private(self.temp, mode=self.log.staging_mode()))
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
        segment = self.log.publish_segment(self.temp, self.start_lsn, end_lsn)
        if self._held is not None and self.rows:
            # the tables written into the file, in order: what a reader of the published segment gets
            self.held = pa.concat_tables(self._held)
        self._held = None
        return segment

    def abort(self) -> None:
        """Drop what was written; the temporary file never becomes a segment."""
        self._held = self.held = None
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        with contextlib.suppress(FileNotFoundError):
            self.temp.unlink()
