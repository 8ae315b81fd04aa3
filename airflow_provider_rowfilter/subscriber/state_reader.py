"""Read-only access to schema ``rowfilter``: where a subscription stands, as plain dataclasses.

Each read is written once, as a *plan*: a generator that yields ``(statement, parameters)`` and is
sent each statement's rows back, and returns the mapped result. :class:`StateReader` runs plans on a
blocking ``psycopg.Connection`` (the jobs, the CLI, the hook, the operators' summaries);
:class:`AsyncStateReader` runs the same plans on a ``psycopg.AsyncConnection`` (the trigger). Nothing
here writes, so a role with ``SELECT`` on the schema is enough. Writers are in subscriber/state.py
(:class:`~airflow_provider_rowfilter.subscriber.state.StateStore`, a reader that also writes).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import psycopg

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.publication.copy_definitions import copy_definition_changes
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.subscriber.state_migrations import SCHEMA

T = TypeVar("T")
#: A read: yields (SQL, parameters), is sent back each statement's rows, returns the result.
Plan = Generator[tuple[str, tuple], list[tuple], T]


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
    #: Set while a reconcile holds the table in ``d`` (flows/verify/reconcile.py): since when.
    reconcile_since: datetime | None = None
    #: The publisher's timeline ``lsn`` was taken on, when it came from its WAL directly (a copy, a reconcile,
    #: refresh without copy); None for a batch end (in the change log) or a subscriber before migration 8.
    lsn_timeline: int | None = None
    #: When the table entered ``state`` (``updated_at`` before migration 8; it also moves with a recorded error).
    state_since: datetime | None = None

    @property
    def reconciling(self) -> bool:
        return self.reconcile_since is not None


@dataclass(frozen=True)
class TableCheckRecord:
    """One ``table_check`` row: the table's last verify or reconcile (``result``: core/compare/table_compare.py TableCheck)."""

    table: TableName
    kind: str
    lsn: str | None
    clean: bool
    result: dict[str, Any]
    checked_at: datetime


@dataclass(frozen=True)
class SubscriptionRow:
    """The ``subscription`` row (``applied_lsn``: where the last batch ended; ``skip_lsn``: ``rowfilter skip``)."""

    name: str
    publications: list[str]
    slot_name: str
    capture_publication: str
    options: dict[str, Any]
    enabled: bool
    last_error: str | None
    applied_lsn: str | None
    skip_lsn: str | None


@dataclass(frozen=True)
class StateReading:
    """What the subscriber says about one subscription at one moment (``row`` None: it has no state)."""

    subscription: str
    row: SubscriptionRow | None
    tables: tuple[RelState, ...] = ()

    @property
    def exists(self) -> bool:
        return self.row is not None

    @property
    def last_error(self) -> str | None:
        return None if self.row is None else self.row.last_error


@dataclass(frozen=True)
class BatchRecord:
    """One ``batch_history`` row: what an applied batch moved (``counts`` per table) and how far behind it was."""

    id: int
    start_lsn: str | None
    end_lsn: str | None
    transactions: int | None
    changes: int | None
    lag_bytes: int | None
    lag_seconds: float | None
    duration_ms: int | None
    skipped_lsn: str | None
    counts: dict[str, Any]
    finished_at: datetime
    #: schema_changes: follow: the DDL the batch ran (apply/schema_follow.py SchemaChange.as_dict), or None
    schema_changes: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class RefreshRecord:
    """One ``refresh_history`` row: the tables a refresh added and removed, and the definitions from ``lsn`` on."""

    id: int
    lsn: str
    added: list[str]
    removed: list[str]
    definitions: dict[str, Any]


@dataclass(frozen=True)
class DropRecord:
    """One ``drop_history`` row: when the subscription was dropped (``DROP SUBSCRIPTION``), and what it had."""

    id: int
    dropped_at: datetime
    slot_name: str
    tables: list[str]
    kept_slot: bool


@dataclass(frozen=True)
class Overview:
    """What the Replication page shows of one subscription, read in one go: the state (``reading``), the
    subscriber's clock (``now``), the last batches (newest first), those of the chart's window, the last drop."""

    reading: StateReading
    now: datetime
    batches: tuple[BatchRecord, ...]
    window: tuple[BatchRecord, ...]
    last_drop: DropRecord | None
    #: each table's last verify or reconcile
    checks: dict[TableName, TableCheckRecord] = field(default_factory=dict)
    #: tables past i whose initial-copy filter or column list the last refresh changed, and no reconcile or clean
    #: verify since: what changed (core/publication/copy_definitions.py)
    filter_changes: dict[TableName, str] = field(default_factory=dict)


# --- the plans: SQL and row mapping, once ------------------------------------------------------------
_SUBSCRIPTION = (f"SELECT name, publications, slot_name, capture_publication, options, enabled, last_error, "
                 f"applied_lsn::text, skip_lsn::text FROM {SCHEMA}.subscription WHERE name = %s")
# schema_changes came with migration 12 (read through to_jsonb as well).
# reconcile_since and kind came with migration 5, lsn_timeline and state_since with 8: read through to_jsonb, a subscriber not
# migrated yet reads as having none (no reconcile, every batch the apply's, no position's timeline known).
_TABLES = (f"SELECT schema_name, table_name, state, lsn::text, rows_copied, last_error, updated_at, "
           f"(to_jsonb(r) ->> 'reconcile_since')::timestamptz, (to_jsonb(r) ->> 'lsn_timeline')::int, "
           f"coalesce((to_jsonb(r) ->> 'state_since')::timestamptz, updated_at) "
           f"FROM {SCHEMA}.subscription_rel r WHERE subscription = %s ORDER BY schema_name, table_name")
_BATCHES = (f"SELECT id, start_lsn::text, end_lsn::text, transactions, changes, lag_bytes, lag_seconds, duration_ms, "
            f"skipped_lsn::text, counts, finished_at, to_jsonb(b) -> 'schema_changes' "
            f"FROM {SCHEMA}.batch_history b WHERE subscription = %s "
            f"AND coalesce(to_jsonb(b) ->> 'kind', 'apply') = 'apply'")
_CHECKS = (f"SELECT schema_name, table_name, kind, lsn::text, clean, result, checked_at FROM {SCHEMA}.table_check "
           f"WHERE subscription = %s ORDER BY schema_name, table_name")
_FEEDERS = (f"SELECT DISTINCT subscription FROM {SCHEMA}.subscription_rel WHERE schema_name = %s AND table_name = %s "
            f"AND subscription <> %s ORDER BY 1")
_REFRESHES = (f"SELECT id, lsn::text, added, removed, definitions FROM {SCHEMA}.refresh_history "
              f"WHERE subscription = %s")
_HISTORIES = ("batch_history", "refresh_history")


def _exists(relation: str) -> Plan[bool]:
    """Whether ``rowfilter.<relation>`` exists (a subscriber that no refresh has migrated has none)."""
    rows = yield "SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.{relation}",)
    return bool(rows[0][0])


def _subscription(name: str) -> Plan[SubscriptionRow | None]:
    if not (yield from _exists("subscription")):
        return None  # a subscriber no refresh has reached yet: no schema, so no subscription either
    rows = yield _SUBSCRIPTION, (name,)
    return SubscriptionRow(*rows[0]) if rows else None


def _tables(name: str) -> Plan[list[RelState]]:
    rows = yield _TABLES, (name,)
    return [RelState(TableName(s, t), SyncState(state), lsn, copied, err, ts, since, timeline, entered)
            for s, t, state, lsn, copied, err, ts, since, timeline, entered in rows]


def _checks(name: str) -> Plan[list[TableCheckRecord]]:
    if not (yield from _exists("table_check")):
        return []
    rows = yield _CHECKS, (name,)
    return [TableCheckRecord(TableName(s, t), kind, lsn, clean, result, at)
            for s, t, kind, lsn, clean, result, at in rows]


def _feeders(name: str, table: TableName) -> Plan[list[str]]:
    rows = yield _FEEDERS, (table.schema, table.name, name)
    return [r[0] for r in rows]


def _reading(name: str) -> Plan[StateReading]:
    row = yield from _subscription(name)
    tables = (yield from _tables(name)) if row is not None else []
    return StateReading(name, row, tuple(tables))


def _last_id(history: str, name: str) -> Plan[int]:
    if history not in _HISTORIES:
        raise ValueError(f"not a history table: {history!r}")
    if not (yield from _exists(history)):
        return 0
    rows = yield f"SELECT coalesce(max(id), 0) FROM {SCHEMA}.{history} WHERE subscription = %s", (name,)
    return rows[0][0]


def _batches(name: str, tail: str, params: tuple = ()) -> Plan[list[BatchRecord]]:
    rows = yield f"{_BATCHES} {tail}", (name, *params)
    return [BatchRecord(*row) for row in rows]


def _refreshes(name: str, tail: str, params: tuple = ()) -> Plan[list[RefreshRecord]]:
    rows = yield f"{_REFRESHES} {tail}", (name, *params)
    return [RefreshRecord(*row) for row in rows]


def _renames(name: str) -> Plan[list[tuple[TableName, str, str, str]]]:
    rows = yield (f"SELECT c ->> 'table', c ->> 'column', c ->> 'new_name', c ->> 'lsn' FROM {SCHEMA}.batch_history b, "
                  "jsonb_array_elements(CASE WHEN jsonb_typeof(to_jsonb(b) -> 'schema_changes') = 'array' "
                  "THEN to_jsonb(b) -> 'schema_changes' ELSE '[]' END) c "
                  "WHERE b.subscription = %s AND c ->> 'kind' = 'rename' ORDER BY b.id"), (name,)
    return [(TableName.parse(t), old, new, lsn) for t, old, new, lsn in rows]


def _last_drop(name: str) -> Plan[DropRecord | None]:
    if not (yield from _exists("drop_history")):
        return None
    rows = yield (f"SELECT id, dropped_at, slot_name, tables, kept_slot FROM {SCHEMA}.drop_history "
                  "WHERE subscription = %s ORDER BY id DESC LIMIT 1"), (name,)
    return DropRecord(*rows[0]) if rows else None


def _overview(name: str, shown: int, window_seconds: float, most: int) -> Plan[Overview]:
    reading = yield from _reading(name)
    now = (yield "SELECT clock_timestamp()", ())[0][0]
    batches: list[BatchRecord] = []
    window: list[BatchRecord] = []
    if reading.exists:
        batches = yield from _batches(name, "ORDER BY id DESC LIMIT %s", (shown,))
        window = yield from _batches(name, "AND finished_at > %s - make_interval(secs => %s) ORDER BY id DESC LIMIT %s",
                                     (now, window_seconds, most))
    drop = (yield from _last_drop(name)) if not reading.exists else None
    checks: dict[TableName, TableCheckRecord] = {}
    changes: dict[TableName, str] = {}
    if reading.exists:
        checks = {c.table: c for c in (yield from _checks(name))}
        last_two = yield from _refreshes(name, "ORDER BY id DESC LIMIT 2")
        if len(last_two) == 2:
            last, before = last_two
            copied = [t.table for t in reading.tables if t.state is not SyncState.INIT]
            for table, change in copy_definition_changes(before.definitions, last.definitions, copied).items():
                check = checks.get(table)
                mended = check is not None and check.lsn is not None and parse_lsn(check.lsn) >= parse_lsn(last.lsn) \
                    and (check.kind == "reconcile" or check.clean)
                if not mended:
                    changes[table] = f"{change} at the refresh of {last.lsn}"
    return Overview(reading, now, tuple(batches), tuple(window), drop, checks, changes)


def _copy_token(name: str, table: TableName, state: SyncState | None) -> Plan[str | None]:
    statement = (f"SELECT updated_at::text FROM {SCHEMA}.subscription_rel WHERE subscription = %s "
                 f"AND schema_name = %s AND table_name = %s")
    params: tuple = (name, table.schema, table.name)
    if state is not None:
        statement, params = statement + " AND state = %s", (*params, state.value)
    rows = yield statement, params
    return rows[0][0] if rows else None


def relation_exists(conn: psycopg.Connection, name: str) -> bool:
    """Whether ``rowfilter.<name>`` exists yet (a subscriber that no refresh has migrated has none)."""
    return run_plan(conn, _exists(name))


def run_plan(conn: psycopg.Connection, plan: Plan[T]) -> T:
    """Run ``plan`` on a blocking connection, in its current transaction (or autocommit)."""
    rows: Any = None
    while True:
        try:
            statement, params = plan.send(rows)
        except StopIteration as done:
            return done.value
        rows = conn.execute(statement, params).fetchall()


async def arun_plan(conn: psycopg.AsyncConnection, plan: Plan[T]) -> T:
    """Run ``plan`` on an asyncio connection: the same statements and mapping as :func:`run_plan`."""
    rows: Any = None
    while True:
        try:
            statement, params = plan.send(rows)
        except StopIteration as done:
            return done.value
        rows = await (await conn.execute(statement, params)).fetchall()


# --- the readers -------------------------------------------------------------------------------------
class StateReader:
    """Reads the replication state of one subscription (blocking; never writes)."""

    def __init__(self, conn: psycopg.Connection, subscription: str) -> None:
        self.conn = conn
        self.subscription = subscription

    def _read(self, plan: Plan[T]) -> T:
        return run_plan(self.conn, plan)

    def subscription_row(self) -> SubscriptionRow | None:
        """The subscription's row; None when the subscriber has no state for it (or no schema yet)."""
        return self._read(_subscription(self.subscription))

    def require_subscription(self) -> SubscriptionRow:
        row = self.subscription_row()
        if row is None:
            drop = self.last_drop()
            if drop is not None:
                raise StateError(
                    f"subscription {self.subscription!r} was dropped at {drop.dropped_at:%Y-%m-%d %H:%M:%S %Z} "
                    f"(DROP SUBSCRIPTION): its slot{' was left on the publisher' if drop.kept_slot else ''} "
                    "and its state are gone", hint="subscribe again with `rowfilter refresh` and a new initial copy "
                    "(the initial-sync DAG), or remove the subscription's spec file")
            raise StateError(f"subscription {self.subscription!r} has no state in the subscriber",
                             hint=f"run `rowfilter refresh` (RefreshPublicationOperator) for {self.subscription!r} first")
        return row

    def last_drop(self) -> DropRecord | None:
        """When the subscription was last dropped (None: never, or no schema yet)."""
        return self._read(_last_drop(self.subscription))

    def overview(self, *, shown: int = 10, window_seconds: float = 6 * 3600, most: int = 2000) -> Overview:
        """The state, the ``shown`` newest batches, the batches of the last ``window_seconds`` (at most ``most``),
        and the last drop when the subscription has no state: the Replication page's one read."""
        return self._read(_overview(self.subscription, shown, window_seconds, most))

    def tables(self, tables: Iterable[TableName] | None = None) -> list[RelState]:
        """The subscription's tables and their states, by name (only ``tables`` when given)."""
        rels = self._read(_tables(self.subscription))
        wanted = set(tables) if tables is not None else None
        return [r for r in rels if wanted is None or r.table in wanted]

    def chosen_tables(self, tables: Sequence[TableName] | None) -> list[RelState]:
        """The subscription's tables, or ``tables`` of them in their order, once each; each must be one of its
        tables (:class:`StateError` names the first that is not)."""
        rels = self.tables()
        if tables is None:
            return rels
        known = {r.table: r for r in rels}
        unknown = [t for t in tables if t not in known]
        if unknown:
            raise StateError(f"table {unknown[0]} is not part of subscription {self.subscription!r}",
                             table=str(unknown[0]),
                             hint=f"its tables are {', '.join(str(t) for t in known) or 'none yet'}; a table newly "
                             "added to a publication joins after `rowfilter refresh`")
        return [known[t] for t in dict.fromkeys(tables)]

    def read_state(self) -> StateReading:
        """The subscription's row and its tables, read together (the sensor's and the DAG factory's view)."""
        return self._read(_reading(self.subscription))

    def copy_token(self, table: TableName, state: SyncState | None = None) -> str | None:
        """The token of the table's copy attempt: its ``updated_at`` as ``set_state(d)`` wrote it (None: no such
        row, or not in ``state``)."""
        return self._read(_copy_token(self.subscription, table, state))

    def checks(self) -> dict[TableName, TableCheckRecord]:
        """Each table's last verify or reconcile, by table (none before migration 5)."""
        return {c.table: c for c in self._read(_checks(self.subscription))}

    def other_subscriptions_of(self, table: TableName) -> list[str]:
        """The other subscriptions of this subscriber whose state names ``table``: they replicate into it too."""
        return self._read(_feeders(self.subscription, table))

    # --- history --------------------------------------------------------------------------------------
    def last_batch_id(self) -> int:
        """The newest ``batch_history`` id of the subscription (0: none, or no schema yet); rows above it
        were written after this call."""
        return self._read(_last_id("batch_history", self.subscription))

    def last_refresh_id(self) -> int:
        """The newest ``refresh_history`` id of the subscription, as :meth:`last_batch_id`."""
        return self._read(_last_id("refresh_history", self.subscription))

    def last_batch(self) -> BatchRecord | None:
        batches = self._read(_batches(self.subscription, "ORDER BY id DESC LIMIT 1"))
        return batches[0] if batches else None

    def batches_after(self, after_id: int) -> list[BatchRecord]:
        """The batches recorded after ``after_id``, newest first."""
        return self._read(_batches(self.subscription, "AND id > %s ORDER BY id DESC", (after_id,)))

    def refreshes(self, after_id: int = 0) -> list[RefreshRecord]:
        """The refreshes recorded after ``after_id`` (every one by default), oldest first."""
        return self._read(_refreshes(self.subscription, "AND id > %s ORDER BY id", (after_id,)))

    def schema_renames(self) -> list[tuple[TableName, str, str, str]]:
        """The columns ``schema_changes: follow`` renamed (table, old name, new name, LSN), oldest first."""
        return self._read(_renames(self.subscription))

    def last_refresh(self) -> RefreshRecord | None:
        refreshes = self._read(_refreshes(self.subscription, "ORDER BY id DESC LIMIT 1"))
        return refreshes[0] if refreshes else None


class AsyncStateReader:
    """:class:`StateReader`'s reads on a ``psycopg.AsyncConnection`` (the triggerer's event loop)."""

    def __init__(self, conn: psycopg.AsyncConnection, subscription: str) -> None:
        self.conn = conn
        self.subscription = subscription

    async def read_state(self) -> StateReading:
        return await arun_plan(self.conn, _reading(self.subscription))
