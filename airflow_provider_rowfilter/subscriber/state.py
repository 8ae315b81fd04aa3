"""The replication state kept in the subscriber, schema ``rowfilter`` (our ``pg_subscription_rel``).

Everything that says where a subscription stands lives here, next to the data, so that a batch can
write its rows and its new position in one transaction. Every statement on the schema is in this
module and its two parts: subscriber/state_migrations.py creates and migrates the schema (:func:`migrate`:
versioned, idempotent, serialised by an advisory lock); subscriber/state_reader.py reads it
(:class:`StateReader`, blocking, and :class:`AsyncStateReader` for the trigger; plain dataclasses
out). :class:`StateStore` is the reader the jobs write with: every state change goes through
:meth:`StateStore.set_state`, which locks the row and refuses moves the state machine does not
make. The one exception is ``rowfilter.apply_stage``, the apply's scratch table (subscriber/apply_target.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg.types.json import Jsonb

from airflow_provider_rowfilter.change_log.identity import LogIdentity, LogNeeds
from airflow_provider_rowfilter.connection import one
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState, check_transition
from airflow_provider_rowfilter.subscriber.state_migrations import SCHEMA, migrate
from airflow_provider_rowfilter.subscriber.state_reader import (
    AsyncStateReader,
    BatchRecord,
    RefreshRecord,
    RelState,
    StateError,
    StateReader,
    StateReading,
    SubscriptionRow,
    TableCheckRecord,
    relation_exists,
)

if TYPE_CHECKING:
    from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

__all__ = [
    "APPLIED", "APPLY_LOCK", "SCHEMA", "AsyncStateReader", "BatchRecord", "DroppedState", "RefreshRecord",
    "RelState", "SlotLostError", "StateError", "StateReader", "StateStore", "SubscriptionRow", "StateReading",
    "TableCheckRecord", "apply_running_for", "job_lock", "job_lock_key", "migrate", "relation_exists", "slot_lost",
]

#: The states whose tables the apply serves (PostgreSQL's apply worker: FINISHEDCOPY, SYNCDONE, READY).
APPLIED = (SyncState.FINISHED_COPY, SyncState.SYNCHRONIZED, SyncState.READY)


class StateStore(StateReader):
    """Reads (:class:`StateReader`) and changes the replication state of one subscription in the subscriber.

    The writers run in the caller's transaction, unless they say otherwise.
    """

    # --- subscription --------------------------------------------------------------------------------
    def ensure_subscription(self, publications: Sequence[str], slot_name: str, capture_publication: str,
                            options: dict | None = None) -> None:
        """Create the subscription row, or update its publications and options."""
        self.conn.execute(
            f"""INSERT INTO {SCHEMA}.subscription (name, publications, slot_name, capture_publication, options)
                VALUES (%s, %s, %s, %s, %s)
                ON CONFLICT (name) DO UPDATE SET publications = EXCLUDED.publications,
                    slot_name = EXCLUDED.slot_name, capture_publication = EXCLUDED.capture_publication,
                    options = EXCLUDED.options, updated_at = now()""",
            (self.subscription, list(publications), slot_name, capture_publication, Jsonb(options or {})),
        )

    def log_needs(self) -> LogNeeds:
        """What the subscription needs of its change log: its tables' lowest position, and the log on record.

        Nothing (``since`` None) when the subscriber has no state for it yet; no log on record before
        migration 4.
        """
        if not relation_exists(self.conn, "subscription"):
            return LogNeeds(self.subscription, None)
        rels = [r for r in self.tables() if r.state in APPLIED and r.lsn is not None]
        tables = tuple((str(r.table), parse_lsn(r.lsn)) for r in rels if r.lsn is not None)
        timelines = tuple((str(r.table), r.lsn_timeline) for r in rels if r.lsn_timeline is not None)
        row = None
        if self.conn.execute("SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'change_log_id'",
                             (f"{SCHEMA}.subscription",)).fetchone():
            row = self.conn.execute(
                f"SELECT change_log_id::text, change_log_host, change_log_path FROM {SCHEMA}.subscription "
                f"WHERE name = %s AND change_log_id IS NOT NULL", (self.subscription,)).fetchone()
        return LogNeeds(self.subscription, min((p for _, p in tables), default=None), tables,
                        None if row is None else LogIdentity(*row), timelines)

    def record_change_log(self, identity: LogIdentity) -> None:
        """The subscription is fed from this change log from now on."""
        self.conn.execute(
            f"""UPDATE {SCHEMA}.subscription SET change_log_id = %s, change_log_host = %s, change_log_path = %s,
                    updated_at = now() WHERE name = %s""",
            (identity.id, identity.host, identity.path, self.subscription))

    # --- tables --------------------------------------------------------------------------------------
    def reconcile(self, published: Iterable[TableName], *, copy_data: bool, current_lsn: str,
                  timeline: int | None = None) -> tuple[list[TableName], list[TableName]]:
        """Add newly published tables (``i``, or ``r`` at ``current_lsn`` without copy), drop unpublished ones.

        Tables present before and after are untouched, as ``ALTER SUBSCRIPTION … REFRESH PUBLICATION``
        leaves them (no re-copy even when their filter changed). Runs in the caller's transaction.

        :param timeline: the publisher's timeline ``current_lsn`` was read on (publisher/failover.py
            ``confirmed_timeline``; the standbys confirmed it).
        """
        existing = {r.table for r in self.tables()}
        wanted = set(published)
        added = sorted(wanted - existing)
        removed = sorted(existing - wanted)
        for table in added:
            state, lsn = (SyncState.INIT, None) if copy_data else (SyncState.READY, current_lsn)
            self.conn.execute(
                f"""INSERT INTO {SCHEMA}.subscription_rel (subscription, schema_name, table_name, state, lsn,
                        lsn_timeline) VALUES (%s, %s, %s, %s, %s, %s)""",
                (self.subscription, table.schema, table.name, state.value, lsn, None if lsn is None else timeline))
        for table in removed:
            self.conn.execute(
                f"DELETE FROM {SCHEMA}.subscription_rel WHERE subscription = %s AND schema_name = %s "
                f"AND table_name = %s", (self.subscription, table.schema, table.name))
            if relation_exists(self.conn, "table_check"):
                self.conn.execute(f"DELETE FROM {SCHEMA}.table_check WHERE subscription = %s AND schema_name = %s "
                                  f"AND table_name = %s", (self.subscription, table.schema, table.name))
        return added, removed

    def set_state(self, table: TableName, new: SyncState, *, lsn: str | None = None,
                  rows_copied: int | None = None, resync: bool = False, reconcile: bool = False,
                  timeline: int | None = None) -> None:
        """Move one table to ``new`` (row locked; the move must be one the state machine makes).

        ``reconcile``: the table is in ``d`` for a reconcile (flows/verify/reconcile.py), not a copy; any other move
        clears that mark. ``timeline``: ``lsn`` was taken from the publisher's WAL on that timeline (a copy, a
        reconcile: publisher/failover.py ``confirmed_timeline``); without it, a position that does not move keeps
        the timeline it had, and a new one has none (a batch end).
        """
        row = self.conn.execute(
            f"""SELECT state FROM {SCHEMA}.subscription_rel
                WHERE subscription = %s AND schema_name = %s AND table_name = %s FOR UPDATE""",
            (self.subscription, table.schema, table.name)).fetchone()
        if row is None:
            raise StateError(f"table {table} is not part of subscription {self.subscription!r}", table=str(table),
                             hint="check the table name, or run `rowfilter refresh` after publishing it")
        check_transition(str(table), SyncState(row[0]), new, resync=resync)
        if reconcile and new is not SyncState.DATA_COPY:
            raise ValueError(f"a reconcile holds {table} in state d, not {new.value}")
        self.conn.execute(
            f"""UPDATE {SCHEMA}.subscription_rel SET state = %s, lsn = %s,
                    rows_copied = COALESCE(%s, CASE WHEN %s THEN NULL ELSE rows_copied END),
                    last_error = NULL, updated_at = now(),
                    reconcile_since = CASE WHEN %s THEN coalesce(reconcile_since, now()) END,
                    state_since = CASE WHEN state = %s THEN state_since ELSE now() END,
                    lsn_timeline = CASE WHEN %s::pg_lsn IS NULL THEN NULL WHEN %s::int IS NOT NULL THEN %s::int
                                        WHEN lsn = %s::pg_lsn THEN lsn_timeline END
                WHERE subscription = %s AND schema_name = %s AND table_name = %s""",
            (new.value, lsn, rows_copied, new is SyncState.INIT, reconcile, new.value, lsn, timeline, timeline, lsn,
             self.subscription, table.schema, table.name))

    def advance(self, table: TableName, lsn: str) -> None:
        """Move a ready table's applied position (``r`` stays ``r``; its ``lsn`` is where apply resumes)."""
        self.conn.execute(
            f"""UPDATE {SCHEMA}.subscription_rel SET lsn = %s, last_error = NULL, updated_at = now(),
                    lsn_timeline = CASE WHEN lsn = %s::pg_lsn THEN lsn_timeline END
                WHERE subscription = %s AND schema_name = %s AND table_name = %s AND state = 'r'""",
            (lsn, lsn, self.subscription, table.schema, table.name))

    def lock_tables(self) -> None:
        """Lock every ``subscription_rel`` row of the subscription until the transaction ends (the apply takes
        it before reading the positions it moves: a resync committed meanwhile is then seen, never missed)."""
        self.conn.execute(f"SELECT 1 FROM {SCHEMA}.subscription_rel WHERE subscription = %s FOR UPDATE",
                          (self.subscription,))

    def record_batch(self, *, start_lsn: str | None, end_lsn: str, counts: dict, duration_ms: int,
                     transactions: int, changes: int, skipped_lsn: str | None, lag_bytes: int | None,
                     lag_seconds: float | None, schema_changes: list[dict] | None = None) -> int:
        """The batch is applied through ``end_lsn``: the subscription's ``applied_lsn`` (its error cleared) and
        a ``batch_history`` row; returns the row's id. In the batch's own transaction, with its data.
        ``schema_changes``: the DDL the batch ran on the subscriber's tables (apply/schema_follow.py)."""
        self.conn.execute(f"UPDATE {SCHEMA}.subscription SET applied_lsn = %s, last_error = NULL, updated_at = now() "
                          f"WHERE name = %s", (end_lsn, self.subscription))
        return one(self.conn.execute(
            f"""INSERT INTO {SCHEMA}.batch_history (subscription, start_lsn, end_lsn, counts, duration_ms,
                   transactions, changes, skipped_lsn, lag_bytes, lag_seconds, schema_changes)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
            (self.subscription, start_lsn, end_lsn, Jsonb(counts), duration_ms, transactions, changes, skipped_lsn,
             lag_bytes, lag_seconds, Jsonb(schema_changes) if schema_changes else None)))[0]

    def record_check(self, table: TableName, kind: str, lsn: str | None, clean: bool, result: dict) -> None:
        """Keep a table's last verify or reconcile (``result``: core/compare/table_compare.py ``TableCheck.as_dict``)."""
        self.conn.execute(
            f"""INSERT INTO {SCHEMA}.table_check (subscription, schema_name, table_name, kind, lsn, clean, result)
                VALUES (%s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT (subscription, schema_name, table_name) DO UPDATE SET kind = EXCLUDED.kind,
                    lsn = EXCLUDED.lsn, clean = EXCLUDED.clean, result = EXCLUDED.result, checked_at = now()""",
            (self.subscription, table.schema, table.name, kind, lsn, clean, Jsonb(result)))

    def record_reconcile(self, lsn: str, counts: dict, duration_ms: int, changes: int) -> int:
        """A reconcile's rows written, in the batch history (``kind`` reconcile: the apply's readers pass over it,
        and the subscription's ``applied_lsn`` stays the apply's); returns the row's id."""
        return one(self.conn.execute(
            f"""INSERT INTO {SCHEMA}.batch_history (subscription, kind, start_lsn, end_lsn, counts, duration_ms,
                   transactions, changes) VALUES (%s, 'reconcile', NULL, %s, %s, %s, 0, %s) RETURNING id""",
            (self.subscription, lsn, Jsonb(counts), duration_ms, changes)))[0]

    def skip_transaction(self, lsn: str) -> str | None:
        """``ALTER SUBSCRIPTION … SKIP (lsn = …)``: the next apply drops the remote transaction finished at ``lsn``
        (``NONE`` clears it). Returns the LSN set, None when cleared.

        :raises RowFilterError: as PostgreSQL's ``AlterSubscription`` (subscriptioncmds.c), for an LSN not past
            the subscription's applied position; nothing is changed.
        """
        value = None if lsn.strip().upper() == "NONE" else format_lsn(parse_lsn(lsn.strip()))
        applied = self.require_subscription().applied_lsn
        if value is not None and applied is not None and parse_lsn(value) < parse_lsn(applied):
            raise RowFilterError(f"skip WAL location (LSN {value}) must be greater than origin LSN {applied}",
                                 hint="name the LSN the conflict error gave (the transaction's finish LSN)")
        self.set_skip_lsn(value)
        return value

    def set_skip_lsn(self, lsn: str | None) -> None:
        """``ALTER SUBSCRIPTION … SKIP (lsn = …)``: the remote transaction finishing at ``lsn`` is skipped once."""
        self.conn.execute(f"UPDATE {SCHEMA}.subscription SET skip_lsn = %s, updated_at = now() WHERE name = %s",
                          (lsn, self.subscription))

    def set_enabled(self, enabled: bool) -> bool:
        """``ALTER SUBSCRIPTION … ENABLE`` / ``DISABLE``: a disabled subscription is not applied (its slot keeps
        the changes). Returns whether it was enabled before."""
        before = self.require_subscription().enabled
        self.conn.execute(f"UPDATE {SCHEMA}.subscription SET enabled = %s, updated_at = now() WHERE name = %s",
                          (enabled, self.subscription))
        return before

    def swap_option(self, key: str, value: str | None) -> tuple[bool, str | None]:
        """Set ``options[key]`` to ``value`` (None removes it) only where it differs; return whether it changed
        and the value it had before (one statement, so two workers never both see the change)."""
        row = self.conn.execute(
            f"UPDATE {SCHEMA}.subscription s SET options = CASE WHEN %s::text IS NULL THEN s.options - %s::text "
            f"ELSE s.options || jsonb_build_object(%s::text, %s::text) END FROM {SCHEMA}.subscription old "
            "WHERE s.name = %s AND old.name = s.name AND (old.options ->> %s::text) IS DISTINCT FROM %s::text "
            "RETURNING old.options ->> %s::text",
            (value, key, key, value, self.subscription, key, value, key)).fetchone()
        return (False, None) if row is None else (True, row[0])

    def record_error(self, table: TableName | None, error: str | None) -> None:
        """Remember why the last attempt failed (for the sensor and ``status``; None clears it); commits on
        its own, or with the caller's transaction."""
        with self.conn.transaction():
            if table is None:
                self.conn.execute(f"UPDATE {SCHEMA}.subscription SET last_error = %s, updated_at = now() "
                                  f"WHERE name = %s", (error, self.subscription))
            else:
                self.conn.execute(
                    f"""UPDATE {SCHEMA}.subscription_rel SET last_error = %s, updated_at = now()
                        WHERE subscription = %s AND schema_name = %s AND table_name = %s""",
                    (error, self.subscription, table.schema, table.name))

    def record_refresh(self, lsn: str, added: Sequence[TableName], removed: Sequence[TableName],
                       definitions: dict) -> None:
        self.conn.execute(
            f"""INSERT INTO {SCHEMA}.refresh_history (subscription, lsn, added, removed, definitions)
                VALUES (%s, %s, %s, %s, %s)""",
            (self.subscription, lsn, [str(t) for t in added], [str(t) for t in removed], Jsonb(definitions)))

    def drop(self, *, kept_slot: bool = False) -> DroppedState | None:
        """Forget the subscription (``DROP SUBSCRIPTION``'s subscriber side); None when there was none.

        Deletes its row, its tables' states and positions, and its refresh and batch history: the
        history's positions belong to the slot that goes with it, and apply reads the refresh history,
        so a later subscription of the same name must not inherit it. The subscriber's tables and
        their data stay. A line of ``drop_history`` remembers the drop (``kept_slot``: the slot was left on
        the publisher), so that what runs next says the subscription was dropped. Runs in the caller's
        transaction.
        """
        name = (self.subscription,)
        row = self.conn.execute(f"SELECT 1 FROM {SCHEMA}.subscription WHERE name = %s FOR UPDATE", name).fetchone()
        if row is None:
            return None
        tables = [TableName(s, t) for s, t in self.conn.execute(
            f"DELETE FROM {SCHEMA}.subscription_rel WHERE subscription = %s RETURNING schema_name, table_name", name)]
        refreshes = self.conn.execute(f"DELETE FROM {SCHEMA}.refresh_history WHERE subscription = %s", name).rowcount
        batches = self.conn.execute(f"DELETE FROM {SCHEMA}.batch_history WHERE subscription = %s", name).rowcount
        slot = one(self.conn.execute(f"DELETE FROM {SCHEMA}.subscription WHERE name = %s RETURNING slot_name",
                                     name))[0]
        if relation_exists(self.conn, "drop_history"):  # a subscriber migrated before version 6 keeps no line
            self.conn.execute(f"INSERT INTO {SCHEMA}.drop_history (subscription, slot_name, tables, kept_slot) "
                              "VALUES (%s, %s, %s, %s)", (self.subscription, slot, [str(t) for t in sorted(tables)],
                                                         kept_slot))
        return DroppedState(sorted(tables), refreshes, batches)


@dataclass(frozen=True)
class DroppedState:
    """What :meth:`StateStore.drop` deleted."""

    tables: list[TableName]
    refreshes: int
    batches: int


#: The scope of the apply's job lock; a copy or resync locks the table's name instead.
APPLY_LOCK = "apply"


def job_lock_key(subscription: str, scope: str) -> tuple[str, str]:
    """The session advisory-lock key of one job of a subscription: ``APPLY_LOCK``, or a table's name."""
    return f"rowfilter:{subscription}", scope


@contextmanager
def job_lock(conn: psycopg.Connection, subscription: str, scope: str,
             busy: Callable[[], RowFilterError], *, wait: float = 0) -> Iterator[None]:
    """Hold a job's session advisory lock in the subscriber; raise ``busy()`` when another session holds it
    (still after ``wait`` seconds of trying).

    One apply per subscription, one copy or resync per table: the jobs take their locks here, and
    ``rowfilter drop`` takes the apply's and looks for the others (:func:`job_lock_key`).
    """
    key = job_lock_key(subscription, scope)
    deadline = time.monotonic() + wait
    while not one(conn.execute("SELECT pg_try_advisory_lock(hashtext(%s), hashtext(%s))", key))[0]:
        if time.monotonic() >= deadline:
            raise busy()
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0.01)))
    try:
        yield
    finally:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s), hashtext(%s))", key)


class SlotLostError(RowFilterError):
    """The subscription's slot is gone while tables hold positions read from it."""


def apply_running_for(conn: psycopg.Connection, subscription: str) -> float | None:
    """Seconds since the session holding the subscription's apply lock began, None when no apply runs: an apply
    shown running in Airflow whose session is gone (a killed worker) holds none (subscriber/state.py job_lock)."""
    key = job_lock_key(subscription, APPLY_LOCK)
    found = conn.execute(
        """SELECT extract(epoch FROM clock_timestamp() - a.backend_start)::float8 FROM pg_locks l
           JOIN pg_stat_activity a ON a.pid = l.pid
           WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND l.classid = hashtext(%s)::oid AND l.objid = hashtext(%s)::oid""", key).fetchone()
    return None if found is None or found[0] is None else round(float(found[0]), 1)


def slot_lost(spec: SubscriptionSpec, slot: str, stranded: list[RelState]) -> SlotLostError:
    """The subscription is broken: its slot is gone while ``stranded`` (tables past ``i``) hold
    positions read from it (refresh refuses; the apply stops with this too)."""
    positions = [parse_lsn(r.lsn) for r in stranded if r.lsn is not None]
    since = f"after LSN {format_lsn(min(positions))}" if positions else "since the slot was dropped"
    listed = ", ".join(f"{r.table} ({r.state.value}{'' if r.lsn is None else ' at ' + r.lsn})" for r in stranded)
    return SlotLostError(
        f"subscription {spec.subscription!r} is broken: replication slot \"{slot}\" no longer exists on the "
        f"publisher; changes {since} were never captured",
        detail=f"tables whose position came from that slot: {listed}",
        hint="run `rowfilter refresh --recreate-slot --reconcile` (RefreshPublicationOperator(recreate_slot=True, "
        "reconcile=True)): it creates a new slot and repairs these tables in place, never emptying them "
        "(docs/verify.md); without --reconcile it empties them and sends them back to state i for a new copy; "
        "nothing was changed")
