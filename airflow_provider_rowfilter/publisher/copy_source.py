"""What table synchronization reads from the publisher: one table's published rows and columns, in ranges.

This is tablesync.c ``copy_table`` split so that many readers
can share it: the rows satisfying ANY of the subscription's publications' filters (the ``publish``
parameter ignored: tablesync.c ``fetch_remote_table_info``), only the published columns, ``FROM
ONLY`` a regular table and
from a partitioned root without ``ONLY`` when it is published via root (all partitions' rows,
filtered by the root's filter). The filter always runs on the publisher, inside the query: rows
that do not qualify never leave it.

Each range is read with ``COPY (SELECT cols FROM … WHERE …) TO STDOUT``, the statement tablesync
sends: every value arrives as its PostgreSQL text form in COPY's text format, ready for ``COPY …
FROM STDIN`` on the subscriber, which converts it by its own column types. No value passes through
a driver's or Spark's type, and no row is decoded or re-encoded on the way (:func:`read_copy`).

All readers see one snapshot, exported by a temporary logical slot (:func:`exported_snapshot`), the
way the tablesync worker reads through its slot's snapshot (tablesync.c
``LogicalRepSyncTableStart``): a row that an UPDATE moves
between two ranges during the copy is read exactly once, and the slot's consistent point says
exactly which changes the copy holds.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.pq import ExecStatus

from airflow_provider_rowfilter.connection import open_session
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.relation import Relation, RelKind, TableName
from airflow_provider_rowfilter.core.slot_retention import wal_level_needed
from airflow_provider_rowfilter.identifiers import table_sql

if TYPE_CHECKING:  # the executors import this module too; they need no filter parser (sqlglot)
    from airflow_provider_rowfilter.core.publication.subscription_filters import TableFilters

log = logging.getLogger(__name__)

INTEGER_TYPES = frozenset({"smallint", "integer", "bigint"})

# Rows per block handed from the publisher's COPY to the subscriber's (about 1 MB of a typical row).
DEFAULT_BLOCK_ROWS = 10_000


class CopySourceError(RowFilterError):
    """The publisher's table cannot be read for table synchronization."""


@dataclass(frozen=True)
class CopySource:
    """One published table as table synchronization reads it.

    ``table`` is the publish-as relation (a partitioned root when published via root), ``columns``
    the published columns in the publisher's column order, ``filter_sql`` the OR of the
    publications' filters (``None``: every row), ``only`` whether inheritance children are left to
    their own copy, ``key`` a single integer key column usable for range partitioning.
    """

    table: TableName
    columns: tuple[str, ...]
    filter_sql: str | None
    only: bool
    key: str | None = None


def copy_source(filters: TableFilters, relation: Relation) -> CopySource:
    """Describe the copy of one subscribed table from its effective filters.

    tablesync.c ``fetch_remote_table_info`` and ``copy_table``.
    """
    if relation.name != filters.table:
        raise ValueError(f"relation {relation.name} is not the publish-as table {filters.table}")
    if filters.columns is not None:
        columns = filters.columns
    else:
        columns = tuple(c.name for c in relation.columns if not c.generated)
    key = None
    if len(relation.identity_columns) == 1:
        column = relation.column(relation.identity_columns[0])
        if column is not None and column.type_name in INTEGER_TYPES:
            key = column.name
    return CopySource(
        table=filters.table,
        columns=tuple(columns),
        filter_sql=filters.copy_filter_sql,
        # tablesync.c copy_table: ONLY for regular tables; a root published via root is read whole.
        only=relation.relkind is RelKind.TABLE,
        key=key,
    )


def select_sql(source: CopySource, *, predicate: str | None = None) -> str:
    """The SELECT of the published rows (optionally one range of them), as tablesync's copy_table builds it.

    ``predicate`` is a range condition ANDed to the filter.
    """
    query = sql.SQL("SELECT {} FROM {}{}").format(
        sql.SQL(", ").join(map(sql.Identifier, source.columns)), sql.SQL("ONLY " if source.only else ""),
        table_sql(source.table))
    # Each filter is already parenthesised by copy_filter_sql; the outer pair keeps a range
    # predicate from binding to one side of the OR.
    # The filters go as their text (a publications file's as written, the catalog's as pg_get_expr deparsed it),
    # not rewritten to name pg_catalog: the session's search_path is pinned empty (connection.py open_session),
    # so its functions and operators resolve in pg_catalog alone, which is where a row filter's must be (only
    # built-ins are allowed: publicationcmds.c check_simple_rowfilter_expr_walker). That is how tablesync.c
    # fetch_remote_table_info sends pg_get_expr's text too, whose ruleutils.c generate_operator_name and
    # generate_function_name qualify a name only where the session's path would not find it. Writing
    # OPERATOR(pg_catalog.=) would change the text's precedence (generic-operator precedence), and pg_catalog.f()
    # nothing under the pinned path.
    conditions = [f"({source.filter_sql})"] if source.filter_sql else []
    if predicate:
        conditions.append(predicate)
    if conditions:
        query += sql.SQL(" WHERE ") + sql.SQL(" AND ".join(conditions))
    return query.as_string(None)


def copy_out_sql(source: CopySource, *, predicate: str | None = None) -> str:
    """``COPY (SELECT …) TO STDOUT``: the rows of :func:`select_sql` in COPY's text format."""
    return f"COPY ({select_sql(source, predicate=predicate)}) TO STDOUT"


# --- how the rows are split between readers -------------------------------------------------------
@dataclass(frozen=True)
class KeyRanges:
    """Split by the integer key: ``partitions`` equal strides of [lower, upper), the ends open."""

    lower: int
    upper: int
    partitions: int

    def predicates(self, key: str) -> list[str]:
        """One condition per range, equal strides; the first also takes NULL keys, the ends are open."""
        column = sql.Identifier(key).as_string(None)
        cuts = [self.lower + (self.upper - self.lower) * i // self.partitions for i in range(1, self.partitions)]
        out = []
        for i in range(self.partitions):
            lower = f"{column} >= {cuts[i - 1]}" if i > 0 else None
            upper = f"{column} < {cuts[i]}" if i < len(cuts) else None
            if lower is None:
                out.append(f"({upper} OR {column} IS NULL)" if upper else "TRUE")
            else:
                out.append(f"{lower} AND {upper}" if upper else lower)
        return out

    def describe(self) -> str:
        return f"{self.partitions} ranges of the key"


@dataclass(frozen=True)
class BlockRanges:
    """Split by physical block (TID range scans, PostgreSQL 14+); the last range is open-ended."""

    bounds: tuple[tuple[int, int | None], ...]

    @property
    def partitions(self) -> int:
        return len(self.bounds)

    def predicates(self) -> list[str]:
        out = []
        for start, end in self.bounds:
            lower = f"ctid >= '({start},0)'::tid"
            out.append(lower if end is None else f"{lower} AND ctid < '({end},0)'::tid")
        return out

    def describe(self) -> str:
        return f"{self.partitions} block ranges"


@dataclass(frozen=True)
class SinglePartition:
    partitions: int = 1

    def describe(self) -> str:
        return "one partition"


ReadPlan = KeyRanges | BlockRanges | SinglePartition


def copy_out_statements(source: CopySource, plan: ReadPlan) -> list[str]:
    """One ``COPY … TO STDOUT`` per partition of ``plan``; together they read every published row once."""
    if isinstance(plan, KeyRanges):
        if source.key is None:
            raise ValueError(f"table {source.table} has no integer key to partition by")
        return [copy_out_sql(source, predicate=p) for p in plan.predicates(source.key)]
    if isinstance(plan, BlockRanges):
        return [copy_out_sql(source, predicate=p) for p in plan.predicates()]
    return [copy_out_sql(source)]


#: What several readers add per row they keep, in planner cost units (``seq_page_cost`` = 1): the row's
#: second write on the subscriber, by the move out of the staging table. On 2 CPUs, native copies of
#: 8,000,000 rows keeping 160,000 and 2,000,000 took 0.59 s and 3.63 s: a written row 1.6 µs, and a unit
#: of the scan's estimated cost 1.6–2.7 µs (docs/initial-sync.md, "How many readers").
SECOND_WRITE_COST = 1.0
#: What several readers cost before their first row, in the same units: Spark's tasks and its Python
#: workers, 0.6 s on a warm Spark Connect server (5 s more on a cold one).
SPLIT_START_COST = 400_000.0


def _one_reader() -> int:
    return 1


@dataclass(frozen=True)
class PartitionOptions:
    """How finely a table is split: at most ``max_partitions`` readers, each at least ``min_pages``
    blocks of 8 kB (so small tables stay one partition).

    ``max_partitions`` None is the default: one reader, as tablesync reads a table, unless several pay
    (:func:`split_pays`); then at most ``default_bound()`` (asked only then: the copy job's asks Spark
    its parallelism). ``start_cost`` is :data:`SPLIT_START_COST` but for tests.
    """

    max_partitions: int | None
    min_pages: int = 2048
    default_bound: Callable[[], int] = _one_reader
    start_cost: float = SPLIT_START_COST


def table_pages(conn: psycopg.Connection, source: CopySource) -> int:
    """Blocks to cover: the table's current size, or its largest partition's for a partitioned root.

    ``pg_relation_size`` rather than ``pg_class.relpages``: relpages is only as fresh as the last
    VACUUM/ANALYZE and is 0 for a table never analysed.
    """
    if source.only:
        query = "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::bigint"
    else:
        query = """SELECT coalesce(max(pg_relation_size(relid)), 0) / current_setting('block_size')::bigint
                   FROM pg_partition_tree(%s::regclass) WHERE isleaf"""
    return int(conn.execute(query, (table_sql(source.table).as_string(None),)).fetchone()[0])


def estimated_rows(conn: psycopg.Connection, source: CopySource) -> int | None:
    """The planner's estimate of the rows the copy reads (``pg_class.reltuples``, of every leaf for a root
    read through its partitions); None with a filter (its selectivity is unknown) or never analysed."""
    if source.filter_sql is not None:
        return None
    if source.only:
        query = "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass"
    else:
        query = """SELECT sum(greatest(c.reltuples, 0))::bigint FROM pg_partition_tree(%s::regclass) p
                   JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf"""
    value = conn.execute(query, (table_sql(source.table).as_string(None),)).fetchone()[0]
    return int(value) if value is not None and value > 0 else None


def split_pays(conn: psycopg.Connection, source: CopySource, start_cost: float = SPLIT_START_COST) -> bool:
    """Whether several readers pay for a table: when the publisher's read of its published rows costs more
    (the planner's estimate, which knows an index that serves the filter) than what they add, each kept row
    written twice and Spark's start. One reader otherwise: the subscriber's write, not the publisher's
    scan, is then what takes the time, and a split only adds to it."""
    query = conn.execute(f"EXPLAIN (FORMAT JSON) {select_sql(source)}").fetchone()[0]
    plan = query[0]["Plan"]
    return float(plan["Total Cost"]) > float(plan["Plan Rows"]) * SECOND_WRITE_COST + start_cost


def plan_partitions(conn: psycopg.Connection, source: CopySource, options: PartitionOptions) -> ReadPlan:
    """Choose how to split the read: block ranges (14+), else integer key ranges, else one reader.

    Block ranges first: a TID Range Scan reads its blocks in order as a sequential scan does, while a
    key range is an index scan, which costs the publisher about half as much CPU again per row (and
    random reads when the table is not in key order).
    """
    pages = table_pages(conn, source)
    splits = max(1, math.ceil(pages / max(options.min_pages, 1)))
    blocks = conn.info.server_version >= 140000
    if splits <= 1 or not (blocks or source.key is not None):
        return SinglePartition()
    if options.max_partitions is None:
        if not split_pays(conn, source, options.start_cost):
            log.info("%s: one reader, as tablesync reads it: by the planner's estimates several would cost the "
                     "subscriber more than they save the publisher (--max-partitions N sets their number)", source.table)
            return SinglePartition()
        limit = options.default_bound()
    else:
        limit = options.max_partitions
    wanted = min(max(limit, 1), splits)
    if wanted <= 1:
        return SinglePartition()
    if blocks:
        step = math.ceil(pages / wanted)
        starts = list(range(0, pages, step))[:wanted]
        bounds = tuple((s, starts[i + 1] if i + 1 < len(starts) else None) for i, s in enumerate(starts))
        return BlockRanges(bounds)
    if source.key is not None:
        # min/max without the filter: two index probes on the key's index, never a scan.
        lower, upper = conn.execute(sql.SQL("SELECT min({k}), max({k}) FROM {o}{t}").format(
            k=sql.Identifier(source.key), o=sql.SQL("ONLY " if source.only else ""),
            t=table_sql(source.table))).fetchone()
        if lower is None:
            return SinglePartition()
        partitions = min(wanted, upper - lower + 1)
        return SinglePartition() if partitions <= 1 else KeyRanges(int(lower), int(upper) + 1, partitions)
    return SinglePartition()


# --- one snapshot for every reader ----------------------------------------------------------------
@dataclass(frozen=True)
class ExportedSnapshot:
    """A snapshot readers import (``SET TRANSACTION SNAPSHOT``) and the position it is consistent with.

    ``lsn`` is the consistent point of the temporary slot that exported the snapshot: a transaction
    whose commit record is before it is in the snapshot, one committing at or after it is not. It
    splits the publisher's changes exactly, as the tablesync worker's slot does (tablesync.c
    ``LogicalRepSyncTableStart``).
    """

    snapshot_id: str
    lsn: str
    slot: str

    def session_init_sql(self) -> str:
        """What each reader runs first, inside its own transaction, to read this snapshot."""
        return ("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY; "
                f"SET TRANSACTION SNAPSHOT {sql.Literal(self.snapshot_id).as_string(None)}")


@contextmanager
def exported_snapshot(conn: psycopg.Connection) -> Iterator[ExportedSnapshot]:
    """Create a temporary logical slot on ``conn`` (a ``replication=database`` connection) exporting its snapshot.

    The snapshot can be imported while ``conn`` stays open and idle; closing it drops the slot. Like
    the tablesync worker's slot, creating it waits for the transactions running on the publisher to
    end, and it holds back the publisher's xmin horizon for the length of the copy.
    """
    slot = f"rowfilter_copy_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        try:
            # The pre-15 spelling, which every release since 10 still accepts.
            name, lsn, snapshot_id, _ = conn.execute(
                f"CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT").fetchone()
        except psycopg.Error as e:
            raise CopySourceError(
                f"cannot create the temporary slot that gives the copy its snapshot: {e.diag.message_primary or e}",
                hint="the publisher role needs REPLICATION (as for the subscription's own slot), the publisher "
                f"{wal_level_needed(conn.info.server_version)}, and a free max_replication_slots / max_wal_senders "
                "entry during the copy") from e
        yield ExportedSnapshot(snapshot_id, lsn, name)
    finally:
        conn.close()


# --- one reader -----------------------------------------------------------------------------------
def read_copy(conninfo: dict[str, str], statement: str, snapshot: ExportedSnapshot | None = None, *,
              block_rows: int = DEFAULT_BLOCK_ROWS) -> Generator[bytearray, None, None]:
    """Run ``statement`` (a ``COPY … TO STDOUT``) in ``snapshot``; yield its output in blocks of whole lines.

    Runs on a Spark executor. Each block is ``block_rows`` rows of COPY text (newlines included),
    what ``COPY … FROM STDIN`` takes as is. The rows are read with libpq's own COPY calls (one per
    row, no decoding) and appended to the block, so the per-row work in Python is one call and one copy. The
    transaction is read-only and imports the exported snapshot before anything else.
    """
    conn = open_session(autocommit=False, **conninfo)
    try:
        conn.execute(snapshot.session_init_sql() if snapshot is not None
                     else "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        pgconn = conn.pgconn
        pgconn.send_query(statement.encode())
        result = pgconn.get_result()
        if result is None or result.status != ExecStatus.COPY_OUT:
            _raise_result(conn, result)
        get = pgconn.get_copy_data
        steps = range(max(block_rows, 1))
        while True:
            nbytes = 0
            block = bytearray()
            for _ in steps:
                nbytes, data = get(0)
                if nbytes <= 0:
                    break
                block += data  # one memcpy; cheaper than collecting the rows and joining them
            if block:
                yield block
            if nbytes < 0:  # -1: the COPY ended; -2: it failed (the result below says why)
                break
        result = pgconn.get_result()
        if result is None or result.status != ExecStatus.COMMAND_OK:
            _raise_result(conn, result)
        while pgconn.get_result() is not None:
            pass
    finally:
        conn.close()  # a read-only transaction: nothing to commit


def _raise_result(conn: psycopg.Connection, result) -> None:
    if result is None:
        raise psycopg.OperationalError(conn.pgconn.get_error_message().decode(errors="replace").strip()
                                       or "the publisher ended the copy without a result")
    raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
