"""A table's batch that only UPDATEs existing rows, every column carried: one UPDATE straight from the reduced rows.

subscriber/apply_target.py applies a table's keys from a temporary table of them (subscriber/typed_keys.py): COPY,
ANALYZE, whether each key exists, the counts, the conflict lookup, then the DELETE, UPDATE and INSERT each phase
needs. A batch whose every key of the table is one or more UPDATEs carrying every column (no INSERT, no DELETE,
no unchanged TOAST value, no barrier: pgbench's, or one transaction updating a million rows) needs none of that
when every key has its row: it is one ``UPDATE … FROM unnest(…)``, the keys' items and the rows' values (their
JSON arrays) sent as binary ``text[]`` parameters built from the Arrow columns (no Python per row), cast by the
columns' types exactly as the keys table's UPDATE casts them. Whether every key had its row is the UPDATE's row
count: when one did not (``update_missing``, or an INSERT under ``upsert``), the statement is rolled back to its
savepoint and the table goes the general way, which counts, logs and reports it exactly; so does a row last
written by another origin where the subscriber tracks them (``track_commit_timestamp``: the UPDATE skips such a
row, and the general way logs and counts its ``update_origin_differs``). A table whose conflicts the general way
must judge goes there at once: another unique index (a row's change may collide), a batch judged change by
change. Measured in docs/benchmarks.md (the subscriber's statements).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.adapt import Dumper, PyFormat
from psycopg.pq import Format

from airflow_provider_rowfilter.subscriber.staged_sql import StagedStatements
from airflow_provider_rowfilter.subscriber.typed_keys import key_items

if TYPE_CHECKING:  # loaded by the functions that take Arrow rows: the subscriber's side imports no Arrow
    import pyarrow as pa

#: Whether such a batch is applied by one statement (here) or through the keys table (the way before;
#: bench/subscriber_apply.py and bench/drain.py ``--before-direct-update`` measure one against the other).
DIRECT_UPDATE = True
#: The ``work_mem`` (kB) the UPDATE runs with at least, set for it alone: its hash of the table's keys then fits or
#: nearly (at the default 4MB, 1M rows hashed in 8 batches spill the unnested rows to temporary files; measured at
#: 1M rows, 3.25 s of the backend's CPU against 4.4 s). Never lowered; restored right after the statement.
WORK_MEM_KB = 64 * 1024
#: The largest parameter sent (PostgreSQL takes none past 1 GB, ``MaxAllocSize``): a batch whose values exceed it
#: goes the general way, its rows COPYed.
MAX_PARAMETER_BYTES = 256 * 1024 * 1024
_TEXT_OID, _TEXT_ARRAY_OID = 25, 1009


class TextArray:
    """A one-dimensional ``text[]`` in PostgreSQL's binary form (``array_recv``), sent as a binary parameter."""

    def __init__(self, values: pa.Array) -> None:
        self.data = text_array_binary(values)


class _TextArrayDumper(Dumper):
    format = Format.BINARY
    oid = _TEXT_ARRAY_OID

    def dump(self, obj: TextArray) -> bytes:
        return obj.data


def text_array_binary(values: pa.Array) -> bytes:
    """``values`` (Arrow strings) as the binary form of a ``text[]``: a header (one dimension, whether NULLs are
    in it, the element type, the length, the lower bound 1), then each element's length (-1: NULL) and bytes,
    every number a big-endian int32 (arrayfuncs.c ``array_recv``). Built by Arrow and numpy in a few passes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(values)
    filled = values.fill_null("").cast(pa.large_binary())
    lengths = pc.binary_length(filled).to_numpy(zero_copy_only=False).astype(np.int64)
    if values.null_count:
        lengths = np.where(values.is_valid().to_numpy(zero_copy_only=False), lengths, -1)
    prefixes = pa.array(lengths.astype(">i4").view("S4"), pa.binary(4)).cast(pa.large_binary())
    joined = pc.binary_join_element_wise(prefixes, filled, pa.scalar(b"", pa.large_binary()))
    offsets = np.frombuffer(joined.buffers()[1], np.int64, n + 1, joined.offset * 8)
    header = struct.pack(">iiiii", 1, 1 if values.null_count else 0, _TEXT_OID, n, 1)
    return header + memoryview(joined.buffers()[2])[offsets[0]:offsets[-1]].tobytes()


def updates_only(rows: pa.Table, width: int) -> bool:
    """Whether every key row (one phase, no barrier) is UPDATEs alone carrying every column, each finding a row."""
    import pyarrow.compute as pc

    if not rows.num_rows:
        return False

    def every(mask) -> bool:
        return bool(pc.all(mask.fill_null(False)).as_py())

    return (every(pc.equal(rows.column("phase"), 0)) and every(pc.equal(rows.column("op"), "U"))
            and every(pc.equal(rows.column("n_insert"), 0)) and every(pc.equal(rows.column("n_delete"), 0))
            and every(rows.column("p_present")) and every(pc.equal(rows.column("p_flags"), "0" * width))
            and rows.column("p_conflict_lsn").null_count == rows.num_rows and rows.column("vals").null_count == 0
            and every(pc.equal(rows.column("p_missing_update"), 0))
            and every(pc.equal(rows.column("p_missing_delete"), 0)))


def update_directly(table: StagedStatements, rows: pa.Table, origin: int | None = None) -> int | None:
    """UPDATE every key row's row in one statement; return the UPDATEs applied (each key's ``n_update``), or None,
    nothing written, when the rows do not qualify (:func:`updates_only`), a key found no row, or (``origin``: the
    apply's replication origin, when the subscriber tracks them) a row was last written by another origin, an
    ``update_origin_differs`` the general way logs and counts (subscriber/origin_conflicts.py).

    The keys' items are sent as one ``text[]`` each, the values as one of their JSON arrays (``vals``), read as
    ``jsonb`` once per row and set by the keys table's own SET list (subscriber/staged_sql.py ``_values_set``).
    """
    import pyarrow.compute as pc

    target, conn = table.target, table.conn
    if not DIRECT_UPDATE or not target.key or not updates_only(rows, len(target.columns)):
        return None
    vals = rows.column("vals").combine_chunks()
    if (pc.sum(pc.binary_length(vals)).as_py() or 0) + 4 * len(vals) > MAX_PARAMETER_BYTES:
        return None
    keys = key_items(rows.column("key").combine_chunks(), len(target.key))
    names = [sql.Identifier(f"_k{i}") for i in range(len(keys))]
    # unnest() in the select list streams the rows (in FROM it would store them all first, spilling past work_mem);
    # OFFSET 0: the subquery is not pulled up, so each row's JSON is read once, not once per column
    unnested = sql.SQL(", ").join(sql.SQL("unnest({}) AS {}").format(sql.Placeholder(format=PyFormat.BINARY), name)
                                  for name in [*names, sql.Identifier("vals")])
    statement = sql.SQL("UPDATE {rel} t SET {set} FROM (SELECT {names}, vals::jsonb AS vals FROM (SELECT {unnested}) u "
                        "OFFSET 0) k WHERE {match}").format(
        rel=table.rel, set=table._values_set(sql.SQL("k.vals")), names=sql.SQL(", ").join(names), unnested=unnested,
        match=sql.SQL(" AND ").join([*(sql.SQL("t.{} = k.{}::{}").format(sql.Identifier(k), n, sql.SQL(t))
                                       for k, n, t in zip(target.key, names, target.key_types(), strict=True)),
                                     *_same_origin(origin)]))
    conn.adapters.register_dumper(TextArray, _TextArrayDumper)
    params = [TextArray(a) for a in (*keys, vals)]
    try:
        with conn.transaction() as savepoint:  # a GUC set inside it is undone with it too
            was = conn.execute(
                "SELECT current_setting('work_mem'), set_config('work_mem', CASE WHEN setting::bigint < %s "
                "THEN %s ELSE current_setting('work_mem') END, true) FROM pg_settings WHERE name = 'work_mem'",
                (WORK_MEM_KB, f"{WORK_MEM_KB}kB")).fetchone()[0]
            # never prepared: a generic plan would not know the arrays' lengths (unnest: 10 rows, a nested loop)
            found = conn.execute(statement, params, prepare=False).rowcount
            conn.execute("SELECT set_config('work_mem', %s, true)", (was,))
            if found != rows.num_rows:  # a key without its row: the general way counts and reports it
                raise psycopg.Rollback(savepoint)
    except psycopg.errors.UniqueViolation:
        return None  # rolled back: the general way names the conflict
    if found != rows.num_rows:
        return None
    return int(pc.sum(rows.column("n_update")).as_py() or 0)


def _same_origin(origin: int | None) -> list[sql.Composable]:
    """The condition that a row was last written by the apply's own origin, or by a transaction whose origin is not
    known (origin_conflicts.py ``differing_rows``, negated): a row that fails it is not updated, so the row count
    sends the batch the general way."""
    if origin is None:
        return []
    return [sql.SQL("coalesce((pg_xact_commit_timestamp_origin(t.xmin)).roident, {0}) = {0}").format(
        sql.Literal(origin))]

