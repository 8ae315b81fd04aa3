"""Where a key's net effect cannot answer as PostgreSQL's change-by-change apply does, and the batch's changes of that
table are judged one by one instead.

PostgreSQL's apply worker applies each remote change on its own, and checks every unique index before each INSERT
and UPDATE (execReplication.c ``ExecSimpleRelationInsert``, ``ExecSimpleRelationUpdate`` →
``CheckAndReportConflict``). Ours applies each key's net effect set-based (subscriber/apply_target.py). On a table
whose only unique index is its key the two answer alike: a key's own values are folded in commit order with the
first conflict recorded (flows/apply/change_rows.py ``_folded``), and a change of the key is a barrier of its own. On a
table with another unique index they may not:

- a value a key held in the middle of the batch is never checked (a key inserted onto a local row's unique
  value, then updated away from it: PostgreSQL stops at the INSERT with ``insert_exists``; a key inserted, then
  updated onto a local row's value: PostgreSQL stops at the UPDATE with ``update_exists``, not ``insert_exists``);
- the order between keys is lost: a value one key frees and another takes (two UPDATEs that swap values through a
  third, in three transactions, are applied by PostgreSQL; one set-based UPDATE of both violates the index), or
  takes before the other frees it (PostgreSQL stops, the set-based statements would not).

So, on such a table only (a catalog lookup per table and batch; pgbench's tables have their key only, and cost
nothing more), a phase is *at risk* when a key of it has an INSERT or UPDATE and another change (in a batch of at
most :data:`ONE_BY_ONE_LIMIT` changes of the table: past it, a WARNING instead), or when a row it
would insert or update holds a value another local row holds in a covered unique index (what the conflict checks
of subscriber/unique_conflicts.py read: one join per index); a conflict or unique violation met on the table is at
risk too. Then :class:`ChangeByChange` is raised; the batch's transaction rolls back, and the batch is reduced
again with each of that table's changes a phase of its own (flows/apply/change_rows.py ``Stage.add``,
spark/apply_frames.py ``staged``: ``exact``), applied in commit order, so each INSERT and UPDATE is checked against
the rows as PostgreSQL would find them: the same conflict type, message and DETAIL, or no conflict.

Those phases are walked on the server (:func:`walk`): one PL/pgSQL function, created in the transaction, runs each
phase's statements (the key lookup, DELETE, UPDATE, INSERT: the very texts of subscriber/apply_target.py with the
phase as its variable) in a loop, and stops *before* the first phase that meets what only the Python side reports:
a conflict recorded by the reducer, a unique violation, a barrier (TRUNCATE, a key's move), an
``*_origin_differs``, or a skipped change to write in the conflict log. A unique violation rolls the whole walk
back (one exception block around the loop: a block per phase would give the transaction a subtransaction per
change, past the 64 a backend caches, which slows every snapshot taken on the subscriber and its standbys while it
runs), and the walk runs again up to the phase before it. The counts of the phases walked are read from the keys
table in one statement (each key's ``existed`` as the walk left it: the same sums as the phases'), and that phase
is then applied by the existing path, which raises PostgreSQL's message and DETAIL, or logs and counts and goes
on; the walk resumes after it. A batch walked this way costs about 0.2 ms per change of the table
(bench/change_by_change.py) instead of a handful of round trips per change.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.subscriber.unique_conflicts import UniqueIndex, first_conflicting, unique_indexes

if TYPE_CHECKING:
    from collections.abc import Iterable

    from airflow_provider_rowfilter.subscriber.apply_target import StagedTable
    from airflow_provider_rowfilter.subscriber.staged_sql import TableCounts


log = logging.getLogger(__name__)

#: Judged one by one on the server (:func:`walk`), a table's batch costs about 0.2 ms per change (100,001 UPDATEs of
#: a table with a second unique index: 20.9 s on 2 CPUs under load 11; it was 5 ms per change, one phase's statements
#: at a time from Python). Past this many changes of the table in the batch (the default ``--max-changes``: only a
#: larger setting or a bigger transaction goes past it), a key changed several times alone no longer sends it one by
#: one (a value a key held only in the middle of the batch is then not checked against the local rows, and a WARNING
#: says so); a conflict or a taken value met on the net effects still does, at any size.
ONE_BY_ONE_LIMIT = 100_000


class ChangeByChange(Exception):  # not an error: what the batch's transaction does next
    """The batch must be reduced again with these targets' changes judged one by one (``targets``: their plan
    indexes); nothing of the batch was applied."""

    def __init__(self, targets: Iterable[int], reason: str) -> None:
        self.targets = frozenset(targets)
        super().__init__(reason)


def other_unique_indexes(conn: psycopg.Connection, rel: sql.Composable, key: tuple[str, ...]) -> bool:
    """Whether the table has a unique index other than its key's (any: expression and partial ones too)."""
    row = conn.execute(sql.SQL(
        """SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = {}::regclass AND i.indisunique
                   AND (i.indexprs IS NOT NULL OR i.indpred IS NOT NULL OR array(
                        SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n)
                        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n)
                        <> %s::text[]))""").format(sql.Literal(rel.as_string(conn))), (list(key),)).fetchone()
    return bool(row and row[0])


def phase_at_risk(table: StagedTable, phase: int, others: list[UniqueIndex]) -> str | None:
    """Why phase ``phase`` of ``table`` (a table with a unique index other than its key's; ``others``: those the
    conflict checks cover) cannot be applied as net effects, or None. Read before the phase's statements."""
    several = table.conn.execute(sql.SQL(
        "SELECT key, (SELECT coalesce(sum(n_insert + n_update + n_delete), 0) FROM {keys}) FROM {keys} "
        "WHERE phase = %s AND n_insert + n_update >= 1 AND n_insert + n_update + n_delete >= 2 "
        "LIMIT 1").format(keys=table.keys), (phase,)).fetchone()
    if several is not None and several[1] <= ONE_BY_ONE_LIMIT:
        return f"key {several[0]} is changed more than once in the batch"
    if several is not None:
        log.warning("%s: key %s is changed more than once among the batch's %d changes of the table, more than %d "
                    "to judge one by one: applied as net effects, so a unique value it held only in the middle of "
                    "the batch is not checked against the local rows (PostgreSQL would stop there if one held it; "
                    "a smaller --max-changes judges such batches one by one)", table.target.table, several[0],
                    several[1], ONE_BY_ONE_LIMIT)
    for rows, other_row in ((table._updated_rows(phase), True), (table._new_rows(phase, "k.a_flags"), False)):
        key = first_conflicting(table.conn, table.rel, rows, others, other_row=other_row)
        if key is not None:
            return f"key {key} takes a unique value another row holds"
    return None


def covered_others(conn: psycopg.Connection, rel: sql.Composable, key: tuple[str, ...]) -> list[UniqueIndex]:
    """The unique indexes other than the key's that the conflict checks cover (subscriber/unique_conflicts.py)."""
    return [i for i in unique_indexes(conn, rel) if i.columns != key]


_PHASE = sql.Identifier("rowfilter_walk_phase__")  # the walk's loop variable (no column's name: #variable_conflict)


def walk(table: StagedTable, start: int, last: int, counts: TableCounts) -> int:
    """Apply phases ``start`` … ``last`` of ``table`` (judged change by change, with a key) on the server, up to the
    first one the Python side must apply (see the module doc); add the walked phases' counts to ``counts`` and return
    that phase (``last + 1`` when every one was walked)."""
    conn = table.conn
    barriers = [int(p) for (p,) in conn.execute(sql.SQL(
        "SELECT DISTINCT phase FROM {} WHERE token = %s AND target = %s AND row_kind = 'B' AND phase BETWEEN %s AND %s"
    ).format(table.stage), (table.token, table.target.index, start, last)).fetchall()]
    function = sql.Identifier("pg_temp", f"rowfilter_walk_{table.target.index}")
    if not table.walk_created:  # once per table and batch: its statements are planned once
        conn.execute(_walk_function(table, function))
        table.walk_created = True
    stop = _walked(conn, function, start, last, barriers)
    if stop < 0:  # a unique violation at phase -stop rolled the walk back: walk again up to the phase before it
        stop = -stop
        if stop > start and _walked(conn, function, start, stop - 1, barriers) != stop:
            raise RuntimeError(f"the walk of {table.target.table} did not reach phase {stop} again")
    if stop > start:
        counts.add_phases(conn, table.keys, start, stop - 1)
    return stop


def _walked(conn: psycopg.Connection, function: sql.Composable, start: int, last: int, barriers: list[int]) -> int:
    """Run the walk over phases ``start`` … ``last``: the first phase not walked, or minus the phase whose unique
    violation rolled the whole walk back."""
    row = conn.execute(sql.SQL("SELECT {}(%s, %s, %s::int[])").format(function), (start, last, barriers)).fetchone()
    return int(row[0]) if row is not None else start


def _walk_function(table: StagedTable, function: sql.Composable) -> sql.Composable:
    """``function(first, last, barriers)`` (in ``pg_temp``): the loop of :func:`walk`, over ``table``'s statements."""
    from airflow_provider_rowfilter.identifiers import table_sql
    from airflow_provider_rowfilter.subscriber.origin_conflicts import differing_rows

    q = {"keys": table.keys, "rel": table.rel, "match": table._key_match("t", "k"), "phase": _PHASE}
    python = [sql.SQL("(CASE WHEN k.existed THEN k.p_conflict_lsn ELSE k.a_conflict_lsn END) IS NOT NULL")]
    if table.conflict_log is not None:  # the skipped changes are logged by subscriber/conflicts.py log_keys
        python.append(sql.SQL("(CASE WHEN k.existed THEN k.p_missing_update + k.p_missing_delete "
                              "ELSE k.a_missing_update + k.a_missing_delete END) > 0"))
    origins = sql.SQL("")
    if table.tracks_origins:
        origins = sql.SQL(" OR EXISTS ({})").format(
            differing_rows(table.keys, table.rel, q["match"], _PHASE, table.origin))
    every = sql.Literal("0" * len(table.target.columns))
    body = sql.SQL(
        """#variable_conflict use_column
        DECLARE
          walk_at int := walk_first;
        BEGIN
          FOR {phase} IN walk_first .. walk_last LOOP
            walk_at := {phase};
            IF {phase} = ANY (walk_barriers) THEN RETURN {phase}; END IF;
            IF {phase} > 0 THEN
              UPDATE {keys} k SET existed = EXISTS (SELECT 1 FROM {rel} t WHERE {match}) WHERE k.phase = {phase};
            END IF;
            IF EXISTS (SELECT 1 FROM {keys} k WHERE k.phase = {phase} AND ({python})){origins} THEN
              RETURN {phase};
            END IF;
            DELETE FROM {rel} t USING {keys} k WHERE k.phase = {phase} AND k.existed AND NOT k.p_present AND {match};
            UPDATE {rel} t SET {values_set} FROM {keys} k
              WHERE k.phase = {phase} AND k.existed AND k.p_present AND k.p_flags = {every} AND {match};
            UPDATE {rel} t SET {update_set} FROM {keys} k
              WHERE k.phase = {phase} AND k.existed AND k.p_present AND k.p_flags IS DISTINCT FROM {every} AND {match};
            INSERT INTO {rel_name} ({columns}) OVERRIDING SYSTEM VALUE SELECT {values} FROM {keys} k
              WHERE k.phase = {phase} AND NOT k.existed AND k.a_present;
          END LOOP;
          RETURN walk_last + 1;
        EXCEPTION WHEN unique_violation THEN
          RETURN -walk_at;  -- the whole walk is rolled back (one subtransaction, not one per change)
        END""").format(
        python=sql.SQL(" OR ").join(python), origins=origins, every=every,
        values_set=table._values_set(sql.SQL("k.vals")), update_set=table._update_set(sql.SQL("k.vals"),
                                                                                       sql.SQL("k.p_flags")),
        rel_name=table_sql(table.target.table), columns=table._column_list(),
        values=table._insert_values(sql.SQL("k.vals"), sql.SQL("k.a_flags")), **q).as_string(table.conn)
    tag = "rowfilter_walk"
    while f"${tag}$" in body:
        tag += "_"
    return sql.SQL(
        "CREATE OR REPLACE FUNCTION {}(walk_first int, walk_last int, walk_barriers int[]) RETURNS int "
        "LANGUAGE plpgsql AS {}").format(function, sql.SQL(f"${tag}${body}${tag}$"))
