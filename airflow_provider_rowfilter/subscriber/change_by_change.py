"""Where a key's net effect cannot answer as PostgreSQL's change-by-change apply does, and the batch's changes of that
table are judged one by one instead.

PostgreSQL's apply worker applies each remote change on its own, and checks every unique index before each INSERT
and UPDATE (execReplication.c ``ExecSimpleRelationInsert``, ``ExecSimpleRelationUpdate`` →
``CheckAndReportConflict``). Ours applies each key's net effect set-based (subscriber/apply_target.py). On a table
whose only unique index is its key the two answer alike: a key's own values are folded in commit order with the
first conflict recorded (apply/net_effect.py ``_folded``), and a change of the key is a barrier of its own. On a
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
again with each of that table's changes a phase of its own (apply/net_effect.py ``_Stage.add``,
spark/apply_frames.py ``staged``: ``exact``), applied in commit order, so each INSERT and UPDATE is checked against
the rows as PostgreSQL would find them: the same conflict type, message and DETAIL, or no conflict. Each phase
costs a handful of statements: slower for that table and that batch only.
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


log = logging.getLogger(__name__)

#: Judged one by one, a table's batch costs a handful of statements per change (about 5 ms each: 2,001 changes took
#: 9.6 s). Past this many changes of the table in the batch, a key changed several times alone no longer sends it one
#: by one (a value a key held only in the middle of the batch is then not checked against the local rows, and a
#: WARNING says so); a conflict or a taken value met on the net effects still does, at any size.
ONE_BY_ONE_LIMIT = 5000


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
