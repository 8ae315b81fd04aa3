"""``rowfilter.apply_stage``: one attempt's net effect of a batch, between the reducers and the batch's transaction.

Its columns are declared once, here (:data:`STAGE_COLUMNS`: name, Arrow type, SQL type): the table's DDL
(subscriber/state_migrations.py), the rows the in-process reducer builds (flows/apply/net_effect.py) and the
projection Spark stages (spark/apply_frames.py) are all made from the declaration, and
subscriber/apply_target.py reads the rows back by these names.

A key's row (``row_kind`` ``K``) holds the key's net effect twice: as if the key existed in the
subscriber before the batch (``p_*``, "present") and as if it did not (``a_*``, "absent"), each an
*outcome* of :data:`OUTCOME_FIELDS`; a barrier's row (``B``: a TRUNCATE, an UPDATE that changes the
key, a change of a table without a key) holds the one statement. The table holds no state: it is
unlogged, keyed by a token per attempt, and rebuilt from the change log whenever it is lost.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.connection import open_session

if TYPE_CHECKING:
    import pyarrow as pa

STAGE = sql.SQL("rowfilter.apply_stage")
#: What an outcome says, for one start (the key existed before the batch, or not): whether a row is left,
#: the flag of each column (0 the staged value, 1 the column's default, 2 the subscriber's value), the
#: first conflicting INSERT (commit LSN, xid), and the UPDATEs and DELETEs that found no row.
OUTCOME_FIELDS = ("present", "flags", "conflict_lsn", "conflict_xid", "missing_update", "missing_delete")


@dataclass(frozen=True)
class StageColumn:
    """One column of the stage: its name, its Arrow type (``pyarrow.type_for_alias``), its SQL type
    (as ``format_type`` spells it) and whether it may be NULL."""

    name: str
    arrow: str
    sql: str
    nullable: bool = True

    @property
    def spark(self) -> str:
        """Its Spark SQL type."""
        return _SPARK_TYPES[self.arrow]


_SPARK_TYPES = {"string": "string", "int32": "int", "int64": "bigint", "bool": "boolean"}
_SQL_OF_OUTCOME = {"present": ("bool", "boolean"), "flags": ("string", "text")}


def _outcome_columns(side: str) -> tuple[StageColumn, ...]:
    return tuple(StageColumn(f"{side}_{name}", *_SQL_OF_OUTCOME.get(name, ("int64", "bigint")))
                 for name in OUTCOME_FIELDS)


#: The stage's columns, in the order both reducers produce them.
STAGE_COLUMNS: tuple[StageColumn, ...] = (
    StageColumn("token", "string", "text", nullable=False),  # the attempt's (new_token)
    StageColumn("target", "int32", "integer", nullable=False),  # the subscriber table: its index in the plan
    StageColumn("phase", "int32", "integer", nullable=False),  # between two barriers of the table
    StageColumn("row_kind", "string", "text", nullable=False),  # K a key's net effect, B a barrier
    # a barrier's: T, U, D, I; n an UPDATE or DELETE it cannot find; a key's: its first change's (I, U, D)
    StageColumn("op", "string", "text"),
    StageColumn("key", "string", "text"),  # JSON array of the key's values (a barrier: the key it finds)
    StageColumn("n_insert", "int64", "bigint"),  # a key's changes, per operation
    StageColumn("n_update", "int64", "bigint"),
    StageColumn("n_delete", "int64", "bigint"),
    StageColumn("vals", "string", "text"),  # JSON array, one value per subscriber column (NULL: none to write)
    *_outcome_columns("p"),
    *_outcome_columns("a"),
    # a barrier's transaction; a key's when all its changes are one transaction's (else NULL)
    StageColumn("commit_lsn", "int64", "bigint"),
    StageColumn("xid", "int64", "bigint"),
    StageColumn("restart_identity", "bool", "boolean"),  # a TRUNCATE's RESTART IDENTITY
)
#: The index the applying transaction reads the stage through.
STAGE_INDEX = ("token", "target", "row_kind", "phase")


def stage_ddl() -> str:
    """The migration that makes ``rowfilter.apply_stage`` the declared table (subscriber/state_migrations.py).

    Creates it when missing. A table of another shape (made by an earlier version) is replaced only
    while it is empty; a batch an apply of that version staged and has not applied yet stops the
    migration, which a later run repeats, instead of vanishing under it.
    """
    columns = ", ".join(f"{c.name} {c.sql}{'' if c.nullable else ' NOT NULL'}" for c in STAGE_COLUMNS)
    declared = ", ".join(f"'{c.name} {c.sql}{'' if c.nullable else ' not null'}'"
                         for c in sorted(STAGE_COLUMNS, key=lambda c: c.name))
    return f"""
    DO $$
    BEGIN
        IF to_regclass('rowfilter.apply_stage') IS NULL THEN
            RETURN;
        END IF;
        LOCK TABLE rowfilter.apply_stage IN ACCESS EXCLUSIVE MODE;
        IF (SELECT array_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                             || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END ORDER BY a.attname)
            FROM pg_attribute a
            WHERE a.attrelid = 'rowfilter.apply_stage'::regclass AND a.attnum > 0 AND NOT a.attisdropped)
           IS NOT DISTINCT FROM ARRAY[{declared}] THEN
            RETURN;
        END IF;
        IF EXISTS (SELECT FROM rowfilter.apply_stage) THEN
            RAISE EXCEPTION 'rowfilter.apply_stage holds a batch staged by an apply of an earlier version'
                USING ERRCODE = 'lock_not_available',
                      HINT = 'let that apply finish (or delete the rows of a subscription no apply runs for) '
                             'and run again';
        END IF;
        DROP TABLE rowfilter.apply_stage;
    END $$;
    CREATE UNLOGGED TABLE IF NOT EXISTS rowfilter.apply_stage ({columns});
    CREATE INDEX IF NOT EXISTS apply_stage_token ON rowfilter.apply_stage ({", ".join(STAGE_INDEX)});
    """


def stage_fingerprint() -> str:
    """A digest of the declaration: a change of it needs a migration running :func:`stage_ddl` again."""
    text = ";".join(f"{c.name} {c.arrow} {c.sql} {c.nullable}" for c in STAGE_COLUMNS) + "|" + ",".join(STAGE_INDEX)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@cache
def arrow_schema() -> pa.Schema:
    """The stage's columns as an Arrow schema (what the in-process reducer builds, what COPY writes)."""
    import pyarrow as pa

    return pa.schema([(c.name, pa.type_for_alias(c.arrow)) for c in STAGE_COLUMNS])


def copy_stage(conninfo: dict[str, str], columns: Sequence[str], batches: Iterable) -> Iterator:
    """``mapInArrow`` body: COPY a partition's staged rows (Arrow record batches) into ``apply_stage``.

    Each batch is written as CSV by Arrow (strings quoted, NULL an empty field: PostgreSQL's CSV
    rules) and streamed into one ``COPY … FROM STDIN``, one subscriber transaction per task. A
    retried task may stage a key twice under the same token; the apply reads one row per key.
    Yields one batch with the number of rows written.
    """
    import pyarrow as pa

    with open_session(autocommit=False, **conninfo) as conn:
        rows = copy_csv(conn, STAGE, columns, batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def copy_csv(conn: psycopg.Connection, table: sql.Composable, columns: Sequence[str], batches: Iterable) -> int:
    """COPY Arrow record batches into ``table``, written as CSV by Arrow; returns the rows written."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        table, sql.SQL(", ").join(sql.Identifier(c) for c in columns))
    options = pa_csv.WriteOptions(include_header=False)
    rows = 0
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for batch in batches:
            if batch.num_rows:
                sink = pa.BufferOutputStream()
                pa_csv.write_csv(batch, sink, options)
                copy.write(memoryview(sink.getvalue()))
                rows += batch.num_rows
    return rows


def copy_stage_rows(rows, conninfo: dict[str, str]) -> int:
    """COPY staged rows held in this process (an Arrow table) into ``apply_stage``; returns how many."""
    return sum(b["rows"][0].as_py() for b in copy_stage(conninfo, rows.column_names, rows.to_batches()))


#: The batch transaction's own stage, for rows reduced in the job's process: a temporary table of the stage's
#: columns, written once inside the transaction that applies it (no second connection, no WAL, nothing to
#: delete afterwards: it is dropped at commit).
LOCAL_STAGE = sql.Identifier("rowfilter_batch_stage")


def stage_locally(conn: psycopg.Connection, rows: pa.Table) -> sql.Composable:
    """COPY staged rows held in this process into :data:`LOCAL_STAGE`, in the caller's transaction; returns it."""
    conn.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE {}) ON COMMIT DROP").format(LOCAL_STAGE, STAGE))
    copy_csv(conn, LOCAL_STAGE, rows.column_names, rows.to_batches(max_chunksize=50_000))
    conn.execute(sql.SQL("CREATE INDEX ON {} ({})").format(
        LOCAL_STAGE, sql.SQL(", ").join(sql.Identifier(c) for c in STAGE_INDEX if c != "token")))
    return LOCAL_STAGE


def stage_more(conn: psycopg.Connection, rows: pa.Table) -> None:
    """COPY more rows held in this process into :data:`LOCAL_STAGE` (made by :func:`stage_locally`)."""
    copy_csv(conn, LOCAL_STAGE, rows.column_names, rows.to_batches(max_chunksize=50_000))


def new_token(subscription: str) -> str:
    """The staging token of one apply attempt: its rows are never mistaken for another attempt's."""
    return f"{subscription}:{uuid.uuid4()}"


def clear_stage(conn: psycopg.Connection, subscription: str) -> None:
    """Remove every staged row of ``subscription`` (attempts that died, or the one just applied)."""
    conn.execute(sql.SQL("DELETE FROM {} WHERE token LIKE %s").format(STAGE),
                 (subscription.replace("_", "\\_") + ":%",))
