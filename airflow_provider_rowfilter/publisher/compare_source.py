"""What a verify or reconcile reads from the publisher: the initial copy's rows, hashed per bucket in the database.

The rows are exactly the initial copy's (publisher/copy_source.py ``select_sql``: the table's effective
copy filter, its published columns, ``ONLY`` as tablesync reads it), read in the snapshot of a temporary
slot like the copy's, so the comparison point is an LSN. The bucket sums and the rows of differing
buckets are statements of core/compare/table_compare.py; :func:`read_rows` runs one of them in a snapshot, on
either side (it is what a Spark task runs, or a thread of the job).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.connection import open_session
from airflow_provider_rowfilter.core.compare.table_compare import SESSION_SETTINGS
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.publisher.copy_source import (
    BlockRanges,
    CopySource,
    ExportedSnapshot,
    select_sql,
    table_pages,
)

#: Blocks (8 kB) per reader of a bucket-sum pass: a reader hashes about 16 MB of table.
READER_PAGES = 2048
#: Rows fetched from a server-side cursor at once.
FETCH_ROWS = 10_000


@dataclass(frozen=True)
class Read:
    """One statement run in one snapshot on one side: what a task of a comparison runs (picklable)."""

    side: str  # publisher or subscriber
    conninfo: dict[str, str]
    snapshot: ExportedSnapshot | None
    statement: str


def read_rows(read: Read, *, fetch_rows: int = FETCH_ROWS) -> Iterator[list[tuple]]:
    """Run ``read`` read-only in its snapshot with the comparing sessions' output settings; yield its rows in
    lists of at most ``fetch_rows`` (a server-side cursor: the reader never holds a large result)."""
    conn = _reader(read)
    try:
        with conn.cursor(name="rowfilter_compare") as cursor:
            cursor.itersize = fetch_rows
            cursor.execute(read.statement)
            while rows := cursor.fetchmany(fetch_rows):
                yield rows
    finally:
        conn.close()  # read-only: nothing to commit


def all_rows(read: Read) -> list[tuple]:
    """Every row of ``read``, a small result (bucket sums): without a cursor, so that PostgreSQL may run the
    statement with parallel workers (a cursor's never does: ``CURSOR_OPT_PARALLEL_OK`` is not set for it)."""
    conn = _reader(read)
    try:
        return conn.execute(read.statement).fetchall()
    finally:
        conn.close()


def _reader(read: Read) -> psycopg.Connection:
    """A connection in ``read``'s snapshot (a read-only transaction begun), with the comparing sessions' settings."""
    conn = open_session(autocommit=False, **read.conninfo)
    try:
        conn.execute(read.snapshot.session_init_sql() if read.snapshot is not None
                     else "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute("; ".join(setting.replace("SET ", "SET LOCAL ", 1) for setting in SESSION_SETTINGS))
    except BaseException:
        conn.close()
        raise
    return conn


def reader_predicates(conn: psycopg.Connection, source: CopySource, most: int) -> list[str | None]:
    """How one side's table is split between readers of a full pass: block ranges (TID range scans,
    PostgreSQL 14+) of about :data:`READER_PAGES` each, at most ``most``; ``[None]`` for one reader."""
    pages = table_pages(conn, source)
    wanted = min(max(most, 1), max(1, -(-pages // READER_PAGES)))
    if wanted <= 1 or conn.info.server_version < 140000:
        return [None]
    step = -(-pages // wanted)
    starts = list(range(0, pages, step))[:wanted]
    bounds = tuple((s, starts[i + 1] if i + 1 < len(starts) else None) for i, s in enumerate(starts))
    return list(BlockRanges(bounds).predicates())


def rows_select(source: CopySource, predicate: str | None = None) -> str:
    """The rows compared: the initial copy's SELECT (``predicate`` ANDed to its filter)."""
    return select_sql(source, predicate=predicate)


def key_bounds(conn: psycopg.Connection, source: CopySource, column: str) -> tuple[int, int] | None:
    """``min`` and ``max`` of an integer key over the whole table (two index probes), None when empty."""
    row = conn.execute(sql.SQL("SELECT min({k}), max({k}) FROM {o}{t}").format(
        k=sql.Identifier(column), o=sql.SQL("ONLY " if source.only else ""), t=table_sql(source.table))).fetchone()
    return None if row is None or row[0] is None else (int(row[0]), int(row[1]))


def estimated_rows(conn: psycopg.Connection, source: CopySource) -> int:
    """The planner's row count of the whole table before any filter (every leaf of a root read through its
    partitions): what sizes the buckets. The planner counts the table's pages when it was never analysed
    (a table just copied), where ``pg_class.reltuples`` says nothing."""
    plan = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) SELECT FROM {o}{t}").format(
        o=sql.SQL("ONLY " if source.only else ""), t=table_sql(source.table))).fetchone()[0]
    return int(plan[0]["Plan"]["Plan Rows"])
