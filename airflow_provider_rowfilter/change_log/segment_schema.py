"""The format of a change-log segment: its Parquet schema, the codes it keeps, and changes as its columns.

A segment (change_log/log.py) is one Parquet file of this :data:`SCHEMA`; each row is one change, in
slot order, repeating its transaction's and its relation's facts; its footer's key-value metadata
(:data:`METADATA_KEY`) records the range, the counts, the relations and where it was captured from
(change_log/segment_writer.py writes it, change_log/segment_reader.py reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_rowfilter.core.apply.relation_checks import RelationSpan

FORMAT_VERSION = 1  # of a segment
METADATA_KEY = "rowfilter.change_log"

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
