"""The apply's writes tagged with a replication origin on the subscriber, as PostgreSQL's apply worker tags its own.

The apply worker sets up its subscription's origin (``pg_<suboid>``) for its session
(``replorigin_session_setup`` in src/backend/replication/logical/worker.c) and records each remote
transaction's finish LSN and commit time with the local commit (``replorigin_session_origin_lsn``); the
WAL records of what it writes then carry that origin. A subscription downstream with ``origin = none``
(PostgreSQL 16+: pgoutput's ``pgoutput_origin_filter``) skips those changes, which is what keeps a
cascade or a two-way pair from sending a change back where it came from.

Our apply does the same through the SQL functions (``pg_replication_origin_create``,
``pg_replication_origin_session_setup``, ``pg_replication_origin_xact_setup``; origin.c), with the origin
``rowfilter_<database oid>_<subscription>`` (origins belong to the cluster: two subscriber databases of one
cluster may each hold a subscription of the same name, and an origin is active in one session at a time);
``pg_replication_origin_status`` then shows how far each subscription applied.
These functions are a superuser's by default; a role without them (``GRANT EXECUTE``, the fix the warning
names) applies all the same, untagged: then a downstream ``origin = none`` cannot tell our writes from local
ones. It is warned once per condition, not per run: the subscription's ``options`` in the subscriber record the
role warned about (``origin_functions_refused``), later runs of that role say nothing more, and a run that may
use them again clears it (so a later revoke warns again).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import psycopg

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.subscriber.state import StateStore

log = logging.getLogger(__name__)

#: What this process already warned about: the roles without the functions; the subscriptions whose record of a
#: warning it cleared (:func:`_refused`).
_warned: set[str] = set()
_cleared: set[str] = set()
#: Every origin function the apply, the copy and DROP SUBSCRIPTION call: PostgreSQL revokes them all from PUBLIC
#: (src/backend/catalog/system_functions.sql), so the GRANT the warning gives names each.
FUNCTIONS = ("pg_replication_origin_create(text)", "pg_replication_origin_drop(text)",
             "pg_replication_origin_oid(text)", "pg_replication_origin_session_setup(text)",
             "pg_replication_origin_session_reset()", "pg_replication_origin_session_is_setup()",
             "pg_replication_origin_xact_setup(pg_lsn, timestamp with time zone)")


def origin_name(sub: psycopg.Connection, subscription: str) -> str:
    """The subscription's replication origin on the subscriber ``sub`` is connected to: unique in its cluster, as
    PostgreSQL's own ``pg_<suboid>`` (subscriptioncmds.c ``ReplicationOriginNameForLogicalRep``)."""
    row = sub.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return f"rowfilter_{row[0]}_{subscription}"


def session_origin(sub: psycopg.Connection, subscription: str) -> AbstractContextManager[bool]:
    """Tag what ``sub`` writes in the block with the subscription's origin (set up before the batch's transaction
    and reset after its commit or rollback, as the commit record carries the origin too); yields whether the role
    may. ``sub`` must be outside a transaction (autocommit)."""
    name = origin_name(sub, subscription)
    return _tagged(sub, name, created=(name,), subscription=subscription)


def copy_origin(sub: psycopg.Connection, subscription: str, table: TableName) -> AbstractContextManager[bool]:
    """Tag what ``sub`` writes in the block (a table's initial copy) with an origin of the copy's own, dropped
    after it, as the table synchronization worker writes its copy with ``pg_<suboid>_<relid>`` (tablesync.c
    ``LogicalRepSyncTableStart``) that is dropped when the table is ready: a downstream ``origin = none`` skips the
    copied rows, and on a subscriber with track_commit_timestamp the first remote UPDATE or DELETE of a copied row
    finds it modified "by a non-existent origin" (``*_origin_differs``), as PostgreSQL 18's does. The apply's own
    origin is created first, so it never takes the number the copied rows carry. ``sub`` outside a transaction;
    yields whether the role may."""
    apply_name = origin_name(sub, subscription)
    relid = sub.execute("SELECT %s::regclass::oid", (table_sql(table).as_string(sub),)).fetchone()[0]
    name = f"{apply_name}_{relid}"
    return _tagged(sub, name, created=(apply_name, name), drop=True, subscription=subscription)


@contextmanager
def _tagged(sub: psycopg.Connection, name: str, *, created: Sequence[str], drop: bool = False,
            subscription: str | None = None) -> Iterator[bool]:
    """The session of ``sub`` set up with origin ``name`` for the block (the origins ``created`` first, where
    missing), reset after it and, with ``drop``, ``name`` dropped; yields False, warning once, when the role may
    not."""
    try:
        with sub.transaction():
            for n in created:
                sub.execute("SELECT pg_replication_origin_create(%s) WHERE pg_replication_origin_oid(%s) IS NULL",
                            (n, n))
        # A setup a broken run left on this session (an error between setup and reset) is undone first.
        sub.execute("SELECT pg_replication_origin_session_reset() WHERE pg_replication_origin_session_is_setup()")
        sub.execute("SELECT pg_replication_origin_session_setup(%s)", (name,))
    except psycopg.errors.InsufficientPrivilege:
        _warn(sub, subscription)
        yield False
        return
    if subscription is not None and subscription not in _cleared:  # once per process: one statement, not per batch
        _cleared.add(subscription)
        _refused(sub, subscription, None)
    try:
        yield True
    finally:
        if not sub.broken and sub.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:
            sub.execute("SELECT pg_replication_origin_session_reset()")
            if drop:
                sub.execute("SELECT pg_replication_origin_drop(%s)", (name,))


def origin_id(sub: psycopg.Connection, subscription: str) -> int:
    """The id (``roident``) of the subscription's origin, the one a local row's commit names when the apply wrote it
    (``pg_xact_commit_timestamp_origin``); 0 when it has none yet."""
    row = sub.execute("SELECT roident FROM pg_replication_origin WHERE roname = %s",
                      (origin_name(sub, subscription),)).fetchone()
    return 0 if row is None else int(row[0])


def record_progress(sub: psycopg.Connection, finish_lsn: str) -> None:
    """In the batch's transaction: the remote position it applies through, recorded with its commit as the
    origin's progress (``pg_replication_origin_status.remote_lsn``; worker.c sets
    ``replorigin_session_origin_lsn`` to each remote transaction's end)."""
    sub.execute("SELECT pg_replication_origin_xact_setup(%s::pg_lsn, now())", (finish_lsn,))


def subscription_origins(sub: psycopg.Connection, subscription: str, tables: Sequence[TableName] = ()) -> list[str]:
    """The subscription's origin and those a killed copy of one of ``tables`` may have left, by name."""
    name = origin_name(sub, subscription)
    return [name, *(f"{name}_{row[0]}" for t in tables
                    for row in [sub.execute("SELECT to_regclass(%s)::oid", (table_sql(t).as_string(sub),)).fetchone()]
                    if row is not None and row[0] is not None)]


def undroppable_origins(sub: psycopg.Connection, subscription: str, tables: Sequence[TableName] = ()) -> list[str]:
    """The subscription's origins that exist and that the role may not drop (``pg_replication_origin_drop`` is a
    superuser's unless granted: src/backend/catalog/system_functions.sql revokes it from PUBLIC)."""
    names = subscription_origins(sub, subscription, tables)
    if sub.execute("SELECT has_function_privilege('pg_replication_origin_drop(text)', 'EXECUTE')").fetchone()[0]:
        return []
    return [n for (n,) in sub.execute("SELECT roname FROM pg_replication_origin WHERE roname = ANY(%s) ORDER BY 1",
                                      (names,))]


def drop_origin(sub: psycopg.Connection, subscription: str, tables: Sequence[TableName] = ()) -> None:
    """DROP SUBSCRIPTION drops its origin (subscriptioncmds.c ``DropSubscription``): ours too, where the role may,
    and the origin a copy of one of ``tables`` left when it was killed (:func:`copy_origin`), as DROP SUBSCRIPTION
    drops the table synchronization origins."""
    name = origin_name(sub, subscription)
    try:
        with sub.transaction():
            for n in subscription_origins(sub, subscription, tables):
                sub.execute("SELECT pg_replication_origin_drop(%s) WHERE pg_replication_origin_oid(%s) IS NOT NULL",
                            (n, n))
    except psycopg.errors.InsufficientPrivilege:
        log.warning('replication origin "%s" stays in the subscriber: this role may not drop it '
                    "(SELECT pg_replication_origin_drop('%s') as a superuser)", name, name)


#: The key of ``rowfilter.subscription.options`` that records the role warned about (:func:`_warn`).
REFUSED_KEY = "origin_functions_refused"


def _refused(sub: psycopg.Connection, subscription: str, role: str | None) -> str | None:
    """Record ``role`` as warned about for ``subscription`` (None: clear it); return the role recorded before. Best
    effort: a subscriber whose state cannot be written this way warns per process, as before."""
    try:
        changed, before = StateStore(sub, subscription).swap_option(REFUSED_KEY, role)
    except psycopg.Error as e:
        log.debug("could not record the origin warning's condition: %s", e)
        if not sub.autocommit and not sub.broken:
            sub.rollback()
        return None
    if not changed:  # that role is recorded already (or nothing was, and none is)
        return role
    if role is None and before:
        log.info("the apply's writes carry the replication origin again (role may use the functions now)")
    return before


def _warn(sub: psycopg.Connection, subscription: str | None = None) -> None:
    role = sub.execute("SELECT current_user").fetchone()[0]
    if role in _warned:
        return
    _warned.add(role)
    if subscription is not None:
        _cleared.discard(subscription)
    if subscription is not None and _refused(sub, subscription, role) == role:
        log.debug("role %s may not use the replication origin functions (warned before)", role)
        return
    log.warning("the apply's writes carry no replication origin: role %s may not use the replication origin "
                "functions, so a subscription downstream with origin = none cannot tell them from local writes; "
                "fix: GRANT EXECUTE ON FUNCTION %s TO %s", role, ", ".join(FUNCTIONS), role)


def origin_capacity_warning(sub: psycopg.Connection) -> str | None:
    """A warning when the subscriber's cluster nears its limit of tracked replication origins, else None.

    Every subscription that applies there, native or ours, tracks its progress in one replication state, and
    the cluster has ``max_active_replication_origins`` of them (PostgreSQL 18: src/backend/replication/logical/
    origin.c; ``max_replication_slots`` before); at the limit, the next one cannot set up its origin, and a native
    subscription's apply worker stops with "could not find free replication state slot". An origin left by a
    dropped subscription keeps its state. Warned from 80 % (8 of the default 10).
    """
    setting = "max_active_replication_origins" if sub.info.server_version >= 180000 else "max_replication_slots"
    row = sub.execute(f"SELECT current_setting('{setting}')::int, (SELECT count(*) FROM pg_replication_origin), "
                      "(SELECT array_agg(roname ORDER BY roname) FROM pg_replication_origin WHERE roname LIKE "
                      "'rowfilter\\_%'), has_table_privilege('pg_catalog.pg_replication_origin_status', 'SELECT')"
                      ).fetchone()
    assert row is not None
    limit, created, ours, may_read_status = row[0], row[1], list(row[2] or []), row[3]
    # system_views.sql revokes pg_replication_origin_status from PUBLIC: a role without the grant counts the
    # origins it can see (the catalog), which is what holds a state once each applies.
    tracked = created
    if may_read_status:
        counted = sub.execute("SELECT count(*) FROM pg_catalog.pg_replication_origin_status").fetchone()
        assert counted is not None
        tracked = counted[0]
    used = max(tracked, created)
    if limit <= 0 or used < max(limit - 2, -(-limit * 8 // 10)):
        return None
    shown = ", ".join(ours[:5]) + (f" and {len(ours) - 5} more" if len(ours) > 5 else "")
    return (f"the subscriber's cluster has {used} replication origins of {setting} = {limit} "
            f"({tracked} tracking progress in pg_replication_origin_status{'; ours: ' + shown if ours else ''}): each "
            f"subscription applying there, native or ours, needs one, and at {limit} the next cannot start; drop the "
            "origins no subscription uses (SELECT pg_replication_origin_drop(name), as a superuser) or raise "
            f"{setting} (a restart)")
