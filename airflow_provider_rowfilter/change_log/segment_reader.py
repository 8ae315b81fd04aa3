"""Reading change-log segments: their footers (counts, filtering, relations) and their rows, local or on object storage."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from airflow_provider_rowfilter.change_log.segment_schema import METADATA_KEY, SCHEMA
from airflow_provider_rowfilter.core.apply.relation_checks import IdentitySpan, RelationSpan

if TYPE_CHECKING:
    from airflow_provider_rowfilter.change_log.log import Segment
    from airflow_provider_rowfilter.change_log.store import StoreAccess


def read_metadata(path: str | os.PathLike) -> pq.FileMetaData:
    """A segment's Parquet footer, from a local path or an object (:class:`~.store.ObjectPath`)."""
    opened = getattr(path, "reader_args", None)
    if opened:
        where, filesystem = opened()
        return pq.read_metadata(where, filesystem=filesystem)
    return pq.read_metadata(path)


def read_table(path: str | os.PathLike, **options) -> pa.Table:
    """``pq.read_table`` of a local path or an object (:class:`~.store.ObjectPath`)."""
    opened = getattr(path, "reader_args", None)
    if opened:
        where, filesystem = opened()
        return pq.read_table(where, filesystem=filesystem, **options)
    return pq.read_table(path, **options)


def segment_counts(path: str | os.PathLike) -> tuple[int, int]:
    """(transactions, changes) of a segment: its metadata's transactions, the footer's row count."""
    footer = read_metadata(path)
    raw = (footer.metadata or {}).get(METADATA_KEY.encode())
    facts = json.loads(raw) if raw else {}
    return int(facts.get("transactions", 0)), footer.num_rows


def segment_filtering(path: str | os.PathLike) -> str:
    """Who evaluated the publications for a segment's changes: ``source`` (the publisher's pgoutput, through
    the subscription's publications) or ``spark`` (captured unfiltered; also every segment written before the
    metadata recorded it). The apply never mixes the two in one batch (flows/apply/batch_plan.py)."""
    raw = (read_metadata(path).metadata or {}).get(METADATA_KEY.encode())
    return (json.loads(raw) if raw else {}).get("filtering") or "spark"


def segment_relations(path: str | os.PathLike) -> list[RelationSpan]:
    """The relations a segment holds, each with where it first and last appears.

    From the segment's metadata (``relations``); a segment written before the metadata recorded them
    is read for the few columns that say it (row groups of names and LSNs, not the values).
    """
    metadata = read_metadata(path).metadata or {}
    raw = metadata.get(METADATA_KEY.encode())
    facts = json.loads(raw) if raw else {}
    if "relations" in facts:
        return [RelationSpan.from_document(d) for d in facts["relations"]]
    table = read_table(path, columns=["commit_lsn", "lsn", "relation_oid", "schema", "table", "column_names",
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
    return pa.concat_tables(read_table(s.path, schema=SCHEMA) for s in segments)


def segment_identities(path: str | os.PathLike) -> list[IdentitySpan]:
    """The replica identities the UPDATEs and DELETEs of a segment were logged under (core/apply/plan.py
    ``check_identities``): one entry per table, operation, identity and key, with where it first and last appears.
    Reads the few columns that say it, not the values."""
    table = read_table(path, columns=["commit_lsn", "lsn", "kind", "schema", "table", "replica_identity",
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


#: One part of a segment read by one task: (URL, part, parts). A part is the row groups whose first row falls in
#: its share of the segment's rows (:func:`read_parts`).
SegmentPart = tuple[str, int, int]


def segment_parts(paths: Sequence[str], changes: Sequence[int] | None, rows_per_part: int) -> list[SegmentPart]:
    """The parts the segments ``paths`` are read in: about ``rows_per_part`` rows each (by the log's count of
    ``changes`` of each segment, one part each when unknown)."""
    counts = list(changes) if changes is not None else [0] * len(paths)
    return [(path, part, parts) for path, count in zip(paths, counts, strict=True)
            for parts in [max(1, -(-count // rows_per_part))] for part in range(parts)]


def read_parts(access: StoreAccess, parts: Sequence[SegmentPart], indexes: Iterable[pa.RecordBatch]
               ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body on a Spark executor: read the ``parts`` whose indexes arrive (a column of ids, one a
    task) from the store with pyarrow, as record batches of the log's :data:`SCHEMA`, one row group at a time (a
    segment of an older format gets its missing columns as NULLs). Writes one line to the executor's log per part
    (the segment's name, the rows read: no value)."""
    with access.opened() as filesystem:
        for batch in indexes:
            for index in batch.column(0).to_pylist():
                url, part, count = parts[index]
                key = access.key(url)
                footer = pq.read_metadata(key, filesystem=filesystem)
                starts, total = [], 0
                for group in range(footer.num_row_groups):
                    starts.append(total)
                    total += footer.row_group(group).num_rows
                share = (total * part // count, total * (part + 1) // count)
                groups = [g for g, first in enumerate(starts) if share[0] <= first < share[1]]
                rows = 0
                if groups:
                    fragment = ds.ParquetFileFormat().make_fragment(key, filesystem, row_groups=groups)
                    for read in fragment.to_batches(schema=SCHEMA):
                        rows += read.num_rows
                        yield read
                print(f"rowfilter: read {rows} changes of {key.rsplit('/', 1)[-1]} (part {part + 1} of {count}) "
                      "from the store", file=sys.stderr, flush=True)
