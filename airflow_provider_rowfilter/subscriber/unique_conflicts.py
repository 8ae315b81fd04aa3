"""Which unique indexes of a subscriber table a staged row conflicts with: PostgreSQL 18's ``insert_exists``,
``update_exists`` and ``multiple_unique_conflicts``.

PostgreSQL 18's apply worker checks every unique index of the target before it inserts a row
(execReplication.c ``ExecSimpleRelationInsert`` → ``CheckAndReportConflict`` over the indexes
``InitConflictIndexes`` picked in worker.c): a row whose values exist in one index stops it with
``insert_exists`` naming that index, in several with ``multiple_unique_conflicts`` naming each; an UPDATE's new row likewise
(``ExecSimpleRelationUpdate``: ``update_exists``), against every row but the one it updates. The apply
(subscriber/apply_target.py) finds a conflict on the table's key when it loads the staged keys; these queries
find the others: the unique indexes on plain columns, immediate and not partial, each matched with ``=`` (two
NULLs never conflict, as in a unique index without NULLS NOT DISTINCT). An expression or partial unique index
is not looked at: a row violating one stops the batch with PostgreSQL's unique-violation error instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.subscriber.conflicts import LocalRow


@dataclass(frozen=True)
class UniqueIndex:
    name: str
    columns: tuple[str, ...]


def unique_indexes(conn: psycopg.Connection, rel: sql.Composable) -> list[UniqueIndex]:
    """The unique indexes of ``rel`` (a table's name as SQL) the checks cover, in OID order (the order PostgreSQL
    opens them: relcache.c ``RelationGetIndexList``)."""
    rows = conn.execute(sql.SQL(
        """SELECT c.relname, array(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n)
                                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n)
           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
           WHERE i.indrelid = {}::regclass AND i.indisunique AND i.indimmediate AND i.indpred IS NULL
             AND i.indexprs IS NULL
           ORDER BY i.indexrelid""").format(sql.Literal(rel.as_string(conn)))).fetchall()
    return [UniqueIndex(name, tuple(columns)) for name, columns in rows]


def _match(index: UniqueIndex, left: str, right: str, other_row: bool = False) -> sql.Composable:
    """``left``'s row has ``right``'s values in ``index``; with ``other_row``, and is not the row ``right`` was
    read from (an UPDATE's new row: its ``_oid``, ``_ctid``), as execReplication.c ``FindConflictTuple`` skips the
    tuple being updated."""
    same = sql.SQL(" AND ").join(sql.SQL("{}.{} = {}.{}").format(sql.Identifier(left), sql.Identifier(c),
                                                                 sql.Identifier(right), sql.Identifier(c))
                                 for c in index.columns)
    if not other_row:
        return same
    return sql.SQL("{} AND ({}.tableoid, {}.ctid) <> ({}._oid, {}._ctid)").format(
        same, sql.Identifier(left), sql.Identifier(left), sql.Identifier(right), sql.Identifier(right))


def conflicting_rows(conn: psycopg.Connection, rel: sql.Composable, columns: tuple[str, ...], new_row: sql.Composable,
                     indexes: list[UniqueIndex], other_row: bool = False) -> list[LocalRow]:
    """The local rows ``new_row`` (a one-row SELECT naming ``columns``) conflicts with, one per unique index
    (``other_row``: an UPDATE's new row, which never conflicts with the row it updates)."""
    found = []
    for index in indexes:
        row = conn.execute(sql.SQL("SELECT t.xmin::text, {values}, {keys} FROM {rel} t, ({new}) n WHERE {match} "
                                   "LIMIT 1").format(
            values=sql.SQL(", ").join(sql.SQL("t.{}::text").format(sql.Identifier(c)) for c in columns),
            keys=sql.SQL(", ").join(sql.SQL("t.{}::text").format(sql.Identifier(c)) for c in index.columns),
            rel=rel, new=new_row, match=_match(index, "t", "n", other_row))).fetchone()
        if row is not None:
            found.append(LocalRow(index.name, row[0], tuple(row[1:1 + len(columns)]), index.columns,
                                  tuple(row[1 + len(columns):])))
    return found


def first_conflicting(conn: psycopg.Connection, rel: sql.Composable, new_rows: sql.Composable,
                      indexes: list[UniqueIndex], other_row: bool = False) -> str | None:
    """The ``key`` of the first of ``new_rows`` (a SELECT of ``key`` and the columns) that exists in one of
    ``indexes``, or None (``other_row``: in a row other than the one each new row updates)."""
    for index in indexes:
        row = conn.execute(sql.SQL("SELECT n.key FROM ({new}) n JOIN {rel} t ON {match} ORDER BY n.key LIMIT 1").format(
            new=new_rows, rel=rel, match=_match(index, "t", "n", other_row))).fetchone()
        if row is not None:
            return row[0]
    return None
