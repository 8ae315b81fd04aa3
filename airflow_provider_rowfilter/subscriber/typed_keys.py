"""A batch reduced in the job's process, its keys written once: COPYed straight into the table's typed keys table.

subscriber/apply_target.py applies a table's staged keys from a temporary table of them, one row per key, its
key columns typed (``_k0`` …, looked up through the table's key index) and its values as ``jsonb``, with
``existed``: whether the key has a row in the subscriber when its phase starts. Rows staged by Spark arrive in
``rowfilter.apply_stage`` and are read from there into that table (``StagedTable._load_keys``). Rows reduced in
the job's process (flows/apply/net_effect.py, flows/apply/arrow_fold.py) are held here as Arrow: they used to be COPYed into
the transaction's own stage as text, then read again into the keys table, every row written twice. Now they
are COPYed once, into the keys table itself (:func:`write_keys`), their key items taken out of the staged JSON
key by Arrow; only the barriers (a handful of rows) still go through the transaction's stage
(subscriber/apply_stage.py ``stage_locally``). What each row says (its two outcomes, their flags: the staged
value, the column's default, the subscriber's current value) is the stage's, unchanged.

``existed`` is written with the row as a guess (a key whose first change is an INSERT did not exist, one
first UPDATEd or DELETEd did), then corrected by two statements, an anti-join and a semi-join with the table,
that rewrite only the keys guessed wrong: most batches rewrite none. Measured on 300,000 UPDATEs of a table of
pgbench's accounts' shape: docs/benchmarks.md.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.subscriber.apply_stage import STAGE_COLUMNS, copy_csv, stage_locally
from airflow_provider_rowfilter.subscriber.target_table import ApplyTarget

if TYPE_CHECKING:  # loaded by the functions that take Arrow rows: the subscriber's side imports no Arrow
    import pyarrow as pa

#: Whether rows reduced in the job's process are written once (here) or staged then read again (the way before;
#: bench/subscriber_apply.py and bench/drain.py ``--before-keys-once`` measure one against the other).
WRITE_KEYS_ONCE = True
#: The stage's columns a key row carries into the keys table (after ``phase`` and ``key``, the typed key).
_CARRIED = ("n_insert", "n_update", "n_delete", "vals", "op", "commit_lsn", "xid",
            *(f"{side}_{name}" for side in "pa" for name in ("present", "flags", "conflict_lsn", "conflict_xid",
                                                             "missing_update", "missing_delete")))
_SQL_TYPES = {c.name: c.sql for c in STAGE_COLUMNS} | {"vals": "jsonb"}


def stage_rows(conn: psycopg.Connection, rows: pa.Table) -> tuple[sql.Composable, dict[int, pa.Table]]:
    """Rows reduced in this process, in the batch's transaction: the barriers COPYed into its own stage, each
    target's key rows kept for :func:`write_keys` (``StagedTable.rows``); returns the stage and those rows.
    With :data:`WRITE_KEYS_ONCE` off, every row is staged (the way before) and none kept."""
    if not WRITE_KEYS_ONCE:
        return stage_locally(conn, rows), {}
    barriers, keys = split_rows(rows)
    return stage_locally(conn, barriers), keys


def split_rows(rows: pa.Table) -> tuple[pa.Table, dict[int, pa.Table]]:
    """The barriers' rows (for the transaction's stage) and each target's key rows (for :func:`write_keys`)."""
    import pyarrow.compute as pc

    kind = rows.column("row_kind")
    barriers = rows.filter(pc.equal(kind, "B"))
    keyed = rows.filter(pc.equal(kind, "K"))
    targets = pc.unique(keyed.column("target")).to_pylist()
    if len(targets) == 1:
        return barriers, {targets[0]: keyed}
    return barriers, {t: keyed.filter(pc.equal(keyed.column("target"), t)) for t in targets}


def write_keys(conn: psycopg.Connection, keys: sql.Identifier, rel: sql.Composable, target: ApplyTarget,
               rows: pa.Table, match: sql.Composable) -> pa.Array | None:
    """Create ``keys`` (as ``StagedTable._load_keys`` makes it) from the target's key rows, in one COPY; return
    ``existed`` of each key row of phase 0 when every guess held (the later phases' are NULL), else None.

    :param rel: the table (``t`` in ``match``), :param match: ``t``'s row of the key row ``k``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = ["phase", "key", *(f"_k{i}" for i in range(len(target.key))), *_CARRIED, "existed"]
    types = {**_SQL_TYPES, **{f"_k{i}": t for i, t in enumerate(target.key_types())}, "existed": "boolean"}
    conn.execute(sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DROP").format(keys, sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(types[c])) for c in columns)))
    first_phase = pc.equal(rows.column("phase"), 0)
    if target.key:  # a guess, corrected below: an INSERT finds no row, an UPDATE or DELETE one
        existed = pc.if_else(first_phase, pc.not_equal(rows.column("op"), "I").fill_null(False),
                             pa.nulls(rows.num_rows, pa.bool_()))
    else:  # staged one row per INSERT, by the change's own identity: no such row exists (apply_target.py)
        existed = pa.array([False] * rows.num_rows, pa.bool_())
    items = key_items(rows.column("key").combine_chunks(), len(target.key)) if target.key else []
    written = pa.table([rows.column("phase"), rows.column("key"), *items, *(rows.column(c) for c in _CARRIED),
                        existed], names=columns)
    copy_csv(conn, keys, columns, written.to_batches(max_chunksize=50_000))
    if key_phases(rows):
        conn.execute(sql.SQL("CREATE INDEX ON {} (phase)").format(keys))
    conn.execute(sql.SQL("ANALYZE {} ({})").format(keys, sql.SQL(", ").join(
        sql.Identifier(c) for c in ("phase", "existed", "p_present", "a_present", "p_flags",
                                    *(f"_k{i}" for i in range(len(target.key)))))))
    wrong = 0
    if target.key:  # each statement only when a key was guessed that way
        q = {"keys": keys, "rel": rel, "match": match}
        if pc.any(existed).as_py():
            wrong += conn.execute(sql.SQL("UPDATE {keys} k SET existed = false WHERE k.phase = 0 AND k.existed "
                                          "AND NOT EXISTS (SELECT 1 FROM {rel} t WHERE {match})").format(**q)).rowcount
        if pc.any(pc.and_(first_phase, pc.invert(existed))).as_py():
            wrong += conn.execute(sql.SQL("UPDATE {keys} k SET existed = true WHERE k.phase = 0 AND NOT k.existed "
                                          "AND EXISTS (SELECT 1 FROM {rel} t WHERE {match})").format(**q)).rowcount
    return existed if wrong == 0 else None


def key_phases(rows: pa.Table) -> int:
    """The last phase of the key rows (0: none cuts the table's changes)."""
    import pyarrow.compute as pc

    return pc.max(rows.column("phase")).as_py() or 0


def key_items(keys: pa.Array, width: int) -> list[pa.Array]:
    """The text of each item of the staged keys or values (JSON arrays of ``width`` strings or nulls; a NULL array:
    every item NULL), one array per item.

    Arrays without a backslash (no escaped character) are split by a regular expression in Arrow; any other batch
    is read by Python's JSON decoder, array by array.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pc.any(pc.match_substring(keys, "\\")).as_py():
        item = '(?:"(?P<v{0}>[^"]*)"|(?P<n{0}>null))'
        pattern = r"^\[" + ",".join(item.format(i) for i in range(width)) + r"\]$"
        found = pc.extract_regex(keys, pattern)
        if found.null_count == keys.null_count:  # each array matched (a NULL one gives NULL)
            nulls = pa.nulls(len(keys), pa.string())
            valid = keys.is_valid() if keys.null_count else None
            items = [pc.if_else(pc.equal(found.field(f"n{i}"), "null"), nulls, found.field(f"v{i}"))
                     for i in range(width)]
            return items if valid is None else [pc.if_else(valid, item, nulls) for item in items]
    decoded = [[None] * width if k is None else json.loads(k) for k in keys.to_pylist()]
    return [pa.array([k[i] for k in decoded], pa.string()) for i in range(width)]


#: What a phase's statements may find, when no key row is known (rows staged by Spark): everything.
EVERY_STATEMENT = frozenset({"conflict", "delete", "update", "update_partial", "insert"})


def statements_needed(rows: pa.Table, phase: int, width: int, existed: pa.Array | None = None) -> frozenset[str]:
    """Which of a phase's statements (subscriber/apply_target.py) can touch a row, read from its key rows: a
    statement that finds none is not sent (each one scans the keys table). ``width``: the table's columns;
    ``existed``: each row's, when :func:`write_keys` knows it (phase 0), else either is assumed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    at = pc.equal(rows.column("phase"), phase)
    rows = rows.filter(at)
    if existed is None or phase:
        was = isnt = pa.array([True] * rows.num_rows, pa.bool_())
    else:
        was = existed.filter(at).fill_null(True)
        isnt = pc.invert(existed.filter(at)).fill_null(True)
    present = pc.and_(was, rows.column("p_present").fill_null(False))
    every = pc.equal(rows.column("p_flags"), "0" * width).fill_null(False)
    found = {
        "conflict": pc.any(pc.or_(pc.and_(was, rows.column("p_conflict_lsn").is_valid()),
                                  pc.and_(isnt, rows.column("a_conflict_lsn").is_valid()))),
        "delete": pc.any(pc.and_(was, pc.invert(rows.column("p_present").fill_null(False)))),
        "update": pc.any(pc.and_(present, every)),
        "update_partial": pc.any(pc.and_(present, pc.invert(every))),
        "insert": pc.any(pc.and_(isnt, rows.column("a_present").fill_null(False))),
    }
    return frozenset(name for name, any_ in found.items() if any_.as_py())
