"""The replication state kept in the subscriber, schema ``rowfilter`` (our ``pg_subscription_rel``).

Everything that says where a subscription stands lives here, next to the data, so that a batch can
write its rows and its new position in one transaction. The schema is created and migrated by
:func:`migrate` (versioned, idempotent, serialised by an advisory lock). Every state change goes
through :meth:`StateStore.set_state`, which locks the row and refuses moves the state machine does
not make.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from airflow_provider_rowfilter.change_log.log import LogIdentity, LogNeeds
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState, check_transition

log = logging.getLogger(__name__)

SCHEMA = "rowfilter"
#: The states whose tables the apply serves (PostgreSQL's apply worker: FINISHEDCOPY, SYNCDONE, READY).
APPLIED = (SyncState.FINISHED_COPY, SyncState.SYNCHRONIZED, SyncState.READY)
_LOCK_KEY = 0x726F7766  # "rowf": serialises migrations of one subscriber database

# Each migration runs once, in order, in its own transaction. Never edit a released one; add more.
MIGRATIONS: list[tuple[int, str]] = [
    (1, """
    CREATE TABLE rowfilter.subscription (
        name                 text PRIMARY KEY,
        publications         text[] NOT NULL,
        slot_name            text NOT NULL,
        capture_publication  text NOT NULL,
        options              jsonb NOT NULL DEFAULT '{}',
        enabled              boolean NOT NULL DEFAULT true,
        last_error           text,
        created_at           timestamptz NOT NULL DEFAULT now(),
        updated_at           timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE rowfilter.subscription_rel (
        subscription  text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        schema_name   text NOT NULL,
        table_name    text NOT NULL,
        state         "char" NOT NULL CHECK (state IN ('i', 'd', 'f', 's', 'r')),
        lsn           pg_lsn,
        rows_copied   bigint,
        last_error    text,
        updated_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (subscription, schema_name, table_name)
    );
    CREATE TABLE rowfilter.refresh_history (
        id            bigserial PRIMARY KEY,
        subscription  text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        lsn           pg_lsn NOT NULL,
        added         text[] NOT NULL,
        removed       text[] NOT NULL,
        definitions   jsonb NOT NULL,
        refreshed_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE rowfilter.batch_history (
        id            bigserial PRIMARY KEY,
        subscription  text NOT NULL REFERENCES rowfilter.subscription (name) ON DELETE CASCADE,
        start_lsn     pg_lsn,
        end_lsn       pg_lsn,
        counts        jsonb NOT NULL DEFAULT '{}',
        duration_ms   bigint,
        finished_at   timestamptz NOT NULL DEFAULT now()
    );
    """),
    # ApplyChanges: the subscription's applied position, the one-shot skip (ALTER SUBSCRIPTION … SKIP),
    # and what each batch moved and how far behind the publisher it was.
    (2, """
    ALTER TABLE rowfilter.subscription
        ADD COLUMN applied_lsn pg_lsn,
        ADD COLUMN skip_lsn pg_lsn;
    ALTER TABLE rowfilter.batch_history
        ADD COLUMN transactions bigint,
        ADD COLUMN changes bigint,
        ADD COLUMN skipped_lsn pg_lsn,
        ADD COLUMN lag_bytes bigint,
        ADD COLUMN lag_seconds double precision;
    CREATE INDEX batch_history_subscription ON rowfilter.batch_history (subscription, id);
    -- The net effect of a batch, written by the Spark executors, read by the one applying transaction
    -- (subscriber/apply_target.py). Unlogged: it is rebuilt from the change log whenever it is lost.
    CREATE UNLOGGED TABLE rowfilter.apply_stage (
        token           text NOT NULL,
        target          int NOT NULL,
        phase           int NOT NULL,
        row_kind        text NOT NULL,
        op              text,
        key             text,
        commit_lsn      bigint,
        xid             bigint,
        restart_identity boolean,
        n_insert        bigint,
        n_update        bigint,
        n_delete        bigint,
        p_present       boolean,
        p_vals          text,
        p_flags         text,
        p_conflict_lsn  bigint,
        p_conflict_xid  bigint,
        p_missing_update bigint,
        p_missing_delete bigint,
        a_present       boolean,
        a_vals          text,
        a_flags         text,
        a_conflict_lsn  bigint,
        a_conflict_xid  bigint,
        a_missing_update bigint,
        a_missing_delete bigint
    );
    CREATE INDEX apply_stage_token ON rowfilter.apply_stage (token, target, row_kind, phase);
    """),
    # One staged copy of a key's values: whenever both outcomes have a row, they agree on every value
    # either one reads (spark/apply_frames.py), so staging them twice only doubled the batch's bytes.
    (3, """
    ALTER TABLE rowfilter.apply_stage RENAME COLUMN p_vals TO vals;
    ALTER TABLE rowfilter.apply_stage DROP COLUMN a_vals;
    """),
    # The change log the subscription is fed from (change_log/log.py LogIdentity): its id and where it
    # was read, so a run reading another log is told where the right one is (docs/change-log.md).
    (4, """
    ALTER TABLE rowfilter.subscription
        ADD COLUMN change_log_id uuid,
        ADD COLUMN change_log_host text,
        ADD COLUMN change_log_path text;
    """),
]


class StateError(RowFilterError):
    """The subscriber's replication state is missing or inconsistent."""


@dataclass(frozen=True)
class RelState:
    """One ``subscription_rel`` row."""

    table: TableName
    state: SyncState
    lsn: str | None
    rows_copied: int | None
    last_error: str | None
    updated_at: datetime


def migrate(conn: psycopg.Connection) -> int:
    """Create or upgrade schema ``rowfilter``; return the schema version now in place."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        conn.execute(f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_version (
            version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())""")
        done = {r[0] for r in conn.execute(f"SELECT version FROM {SCHEMA}.schema_version")}
        for version, ddl in MIGRATIONS:
            if version in done:
                continue
            log.info("migrating schema %s to version %d", SCHEMA, version)
            conn.execute(ddl)
            conn.execute(f"INSERT INTO {SCHEMA}.schema_version (version) VALUES (%s)", (version,))
    return max(v for v, _ in MIGRATIONS)


class StateStore:
    """Reads and changes the replication state of one subscription in the subscriber."""

    def __init__(self, conn: psycopg.Connection, subscription: str) -> None:
        self.conn = conn
        self.subscription = subscription

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

    def subscription_row(self) -> dict | None:
        if not relation_exists(self.conn, "subscription"):
            return None  # a subscriber no refresh has reached yet: no schema, so no subscription either
        cur = self.conn.execute(
            f"SELECT name, publications, slot_name, capture_publication, options, enabled, last_error, "
            f"applied_lsn::text, skip_lsn::text FROM {SCHEMA}.subscription WHERE name = %s", (self.subscription,))
        row = cur.fetchone()
        if row is None:
            return None
        keys = ("name", "publications", "slot_name", "capture_publication", "options", "enabled", "last_error",
                "applied_lsn", "skip_lsn")
        return dict(zip(keys, row, strict=True))

    def require_subscription(self) -> dict:
        row = self.subscription_row()
        if row is None:
            raise StateError(f"subscription {self.subscription!r} has no state in the subscriber",
                             hint=f"run `rowfilter refresh` (RefreshPublicationOperator) for {self.subscription!r} first")
        return row

    def log_needs(self) -> LogNeeds:
        """What the subscription needs of its change log: its tables' lowest position, and the log on record.

        Nothing (``since`` None) when the subscriber has no state for it yet; no log on record before
        migration 4.
        """
        if not relation_exists(self.conn, "subscription"):
            return LogNeeds(self.subscription, None)
        tables = tuple((str(r.table), parse_lsn(r.lsn)) for r in self.tables() if r.state in APPLIED)
        row = None
        if self.conn.execute("SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'change_log_id'",
                             (f"{SCHEMA}.subscription",)).fetchone():
            row = self.conn.execute(
                f"SELECT change_log_id::text, change_log_host, change_log_path FROM {SCHEMA}.subscription "
                f"WHERE name = %s AND change_log_id IS NOT NULL", (self.subscription,)).fetchone()
        return LogNeeds(self.subscription, min((p for _, p in tables), default=None), tables,
                        None if row is None else LogIdentity(*row))

    def record_change_log(self, identity: LogIdentity) -> None:
        """The subscription is fed from this change log from now on."""
        self.conn.execute(
            f"""UPDATE {SCHEMA}.subscription SET change_log_id = %s, change_log_host = %s, change_log_path = %s,
                    updated_at = now() WHERE name = %s""",
            (identity.id, identity.host, identity.path, self.subscription))

    # --- tables --------------------------------------------------------------------------------------
    def tables(self, tables: Iterable[TableName] | None = None) -> list[RelState]:
        """The subscription's tables and their states, by name."""
        rows = self.conn.execute(
            f"""SELECT schema_name, table_name, state, lsn::text, rows_copied, last_error, updated_at
                FROM {SCHEMA}.subscription_rel WHERE subscription = %s ORDER BY schema_name, table_name""",
            (self.subscription,)).fetchall()
        wanted = set(tables) if tables is not None else None
        return [
            RelState(TableName(s, t), SyncState(state), lsn, rows, err, ts)
            for s, t, state, lsn, rows, err, ts in rows
            if wanted is None or TableName(s, t) in wanted
        ]

    def reconcile(self, published: Iterable[TableName], *, copy_data: bool,
                  current_lsn: str) -> tuple[list[TableName], list[TableName]]:
        """Add newly published tables (``i``, or ``r`` at ``current_lsn`` without copy), drop unpublished ones.

        Tables present before and after are untouched, as ``ALTER SUBSCRIPTION … REFRESH PUBLICATION``
        leaves them (no re-copy even when their filter changed). Runs in the caller's transaction.
        """
        existing = {r.table for r in self.tables()}
        wanted = set(published)
        added = sorted(wanted - existing)
        removed = sorted(existing - wanted)
        for table in added:
            state, lsn = (SyncState.INIT, None) if copy_data else (SyncState.READY, current_lsn)
            self.conn.execute(
                f"""INSERT INTO {SCHEMA}.subscription_rel (subscription, schema_name, table_name, state, lsn)
                    VALUES (%s, %s, %s, %s, %s)""",
                (self.subscription, table.schema, table.name, state.value, lsn))
        for table in removed:
            self.conn.execute(
                f"DELETE FROM {SCHEMA}.subscription_rel WHERE subscription = %s AND schema_name = %s "
                f"AND table_name = %s", (self.subscription, table.schema, table.name))
        return added, removed

    def set_state(self, table: TableName, new: SyncState, *, lsn: str | None = None,
                  rows_copied: int | None = None, resync: bool = False) -> None:
        """Move one table to ``new`` (row locked; the move must be one the state machine makes)."""
        row = self.conn.execute(
            f"""SELECT state FROM {SCHEMA}.subscription_rel
                WHERE subscription = %s AND schema_name = %s AND table_name = %s FOR UPDATE""",
            (self.subscription, table.schema, table.name)).fetchone()
        if row is None:
            raise StateError(f"table {table} is not part of subscription {self.subscription!r}", table=str(table),
                             hint="check the table name, or run `rowfilter refresh` after publishing it")
        check_transition(str(table), SyncState(row[0]), new, resync=resync)
        self.conn.execute(
            f"""UPDATE {SCHEMA}.subscription_rel SET state = %s, lsn = %s,
                    rows_copied = COALESCE(%s, CASE WHEN %s THEN NULL ELSE rows_copied END),
                    last_error = NULL, updated_at = now()
                WHERE subscription = %s AND schema_name = %s AND table_name = %s""",
            (new.value, lsn, rows_copied, new is SyncState.INIT, self.subscription, table.schema, table.name))

    def advance(self, table: TableName, lsn: str) -> None:
        """Move a ready table's applied position (``r`` stays ``r``; its ``lsn`` is where apply resumes)."""
        self.conn.execute(
            f"""UPDATE {SCHEMA}.subscription_rel SET lsn = %s, last_error = NULL, updated_at = now()
                WHERE subscription = %s AND schema_name = %s AND table_name = %s AND state = 'r'""",
            (lsn, self.subscription, table.schema, table.name))

    def set_skip_lsn(self, lsn: str | None) -> None:
        """``ALTER SUBSCRIPTION … SKIP (lsn = …)``: the remote transaction finishing at ``lsn`` is skipped once."""
        self.conn.execute(f"UPDATE {SCHEMA}.subscription SET skip_lsn = %s, updated_at = now() WHERE name = %s",
                          (lsn, self.subscription))

    def record_error(self, table: TableName | None, error: str) -> None:
        """Remember why the last attempt failed (for the sensor and ``status``); commits on its own."""
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

    def drop(self) -> DroppedState | None:
        """Forget the subscription (``DROP SUBSCRIPTION``'s subscriber side); None when there was none.

        Deletes its row, its tables' states and positions, and its refresh and batch history: the
        history's positions belong to the slot that goes with it, and apply reads the refresh history,
        so a later subscription of the same name must not inherit it. The subscriber's tables and
        their data stay. Runs in the caller's transaction.
        """
        name = (self.subscription,)
        row = self.conn.execute(f"SELECT 1 FROM {SCHEMA}.subscription WHERE name = %s FOR UPDATE", name).fetchone()
        if row is None:
            return None
        tables = [TableName(s, t) for s, t in self.conn.execute(
            f"DELETE FROM {SCHEMA}.subscription_rel WHERE subscription = %s RETURNING schema_name, table_name", name)]
        refreshes = self.conn.execute(f"DELETE FROM {SCHEMA}.refresh_history WHERE subscription = %s", name).rowcount
        batches = self.conn.execute(f"DELETE FROM {SCHEMA}.batch_history WHERE subscription = %s", name).rowcount
        self.conn.execute(f"DELETE FROM {SCHEMA}.subscription WHERE name = %s", name)
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


def relation_exists(conn: psycopg.Connection, name: str) -> bool:
    """Whether ``rowfilter.<name>`` exists yet (a subscriber that no refresh has migrated has none)."""
    return conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.{name}",)).fetchone()[0] is not None


def last_history_id(conn: psycopg.Connection, history: str, subscription: str) -> int:
    """The newest id of ``rowfilter.<history>`` (``refresh_history``, ``batch_history``) for ``subscription``;
    0 when it has none or the table does not exist yet. Rows above it were written after this call."""
    if not relation_exists(conn, history):
        return 0
    return conn.execute(sql.SQL("SELECT coalesce(max(id), 0) FROM {}.{} WHERE subscription = %s").format(
        sql.Identifier(SCHEMA), sql.Identifier(history)), (subscription,)).fetchone()[0]


@contextmanager
def job_lock(conn: psycopg.Connection, subscription: str, scope: str,
             busy: Callable[[], RowFilterError]) -> Iterator[None]:
    """Hold a job's session advisory lock in the subscriber; raise ``busy()`` when another session holds it.

    One apply per subscription, one copy or resync per table: the jobs take their locks here, and
    ``rowfilter drop`` takes the apply's and looks for the others (:func:`job_lock_key`).
    """
    key = job_lock_key(subscription, scope)
    if not conn.execute("SELECT pg_try_advisory_lock(hashtext(%s), hashtext(%s))", key).fetchone()[0]:
        raise busy()
    try:
        yield
    finally:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s), hashtext(%s))", key)
