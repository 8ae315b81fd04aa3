"""DropSubscription: ``DROP SUBSCRIPTION`` for a rowfilter subscription (``rowfilter drop``).

Checks first, then drops, so that a refusal changes nothing: no apply, snapshot or resync of the
subscription may be running (their advisory locks in the subscriber, the capture's among them), the change log
must be listable (an object store's connection and credentials resolved: the last step moves it aside), the role
must be allowed to drop the subscription's replication origins when it has any (else they would stay, each
counting against the subscriber cluster's ``max_active_replication_origins``), and, unless ``keep_slot``, the
publisher must be reachable and the slot not active. Then, in this order:
the slot and the capture publications on the publisher (only the ones we created), the
subscription's rows in schema ``rowfilter`` of the subscriber (its tables' states, its refresh and
batch history, its staged rows) in one transaction, and the change log is moved aside as
``<change_log>.dropped-<time>``. The subscriber's tables and their data stay, as in PostgreSQL.

Interrupted anywhere, running it again finishes the job; with nothing left it reports so and
succeeds. ``keep_slot`` is ``ALTER SUBSCRIPTION … SET (slot_name = NONE)`` followed by ``DROP
SUBSCRIPTION``: the publisher is not contacted, and its slot keeps retaining WAL until a later
``rowfilter drop`` (or ``pg_drop_replication_slot``) drops it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import psycopg

from airflow_provider_rowfilter.change_log.log import ChangeLogError
from airflow_provider_rowfilter.change_log.store import ChangeLog, open_change_log
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.errors import CatalogError, RowFilterError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.humane import size
from airflow_provider_rowfilter.publisher.capture_objects import (
    STOP_BEFORE_DROP,
    capture_names,
    capture_publication_names,
    drop_capture_objects,
)
from airflow_provider_rowfilter.publisher.writer_lock import holders, writer_lock_on
from airflow_provider_rowfilter.subscriber.apply_stage import clear_stage
from airflow_provider_rowfilter.subscriber.copy_target import drop_stagings
from airflow_provider_rowfilter.subscriber.replication_origin import FUNCTIONS, drop_origin, undroppable_origins
from airflow_provider_rowfilter.subscriber.state import (
    APPLY_LOCK,
    StateStore,
    job_lock,
    job_lock_key,
    migrate,
    relation_exists,
)

log = logging.getLogger(__name__)

class DropError(RowFilterError):
    """The subscription cannot be dropped now (nothing of it was)."""


@dataclass
class DropResult:
    subscription: str
    slot: str
    publication: str  # the capture publications dropped (with keep_slot: every name they may have), comma-separated
    keep_slot: bool = False
    slot_dropped: bool = False
    slot_retained_bytes: int | None = None
    slot_invalidated: str | None = None  # the publisher had invalidated it (``invalidation_reason``): useless, dropped
    publication_dropped: bool = False
    left_alone: list[str] = field(default_factory=list)
    state_dropped: bool = False
    tables: list[str] = field(default_factory=list)
    refreshes: int = 0
    batches: int = 0
    change_log_moved_to: str | None = None

    @property
    def dropped(self) -> bool:
        return bool(self.slot_dropped or self.publication_dropped or self.state_dropped or self.change_log_moved_to)

    def slot_note(self) -> str:
        """What the slot dropped was: how much WAL it held back, or that the publisher had invalidated it."""
        if self.slot_invalidated:
            return (f" (the publisher had invalidated it: {self.slot_invalidated}; it held no change that could "
                    "still be read, so dropping it lost nothing)")
        return "" if self.slot_retained_bytes is None else f" (it retained {size(self.slot_retained_bytes)} of WAL)"

    def describe(self) -> str:
        """What went, in one line (the task log's and the job's)."""
        if not self.dropped:
            return "nothing to drop"
        parts = []
        if self.slot_dropped:
            parts.append(f"replication slot {self.slot} dropped on the publisher{self.slot_note()}")
        elif self.keep_slot:
            parts.append(f"replication slot {self.slot} left on the publisher (keep_slot): it retains WAL until dropped")
        if self.publication_dropped:
            parts.append(f"publication {self.publication} dropped on the publisher")
        if self.state_dropped:
            parts.append(f"state of {len(self.tables)} table(s) ({', '.join(self.tables) or 'none'}), "
                         f"{self.refreshes} refresh(es) and {self.batches} batch(es) of history dropped in the subscriber")
        if self.change_log_moved_to:
            parts.append(f"change log moved to {self.change_log_moved_to}")
        parts.extend(f"left alone: {note}" for note in self.left_alone)
        return "dropped: " + "; ".join(parts) + "; the subscriber's tables and their data are kept"


def drop(spec: SubscriptionSpec, *, keep_slot: bool = False) -> DropResult:
    """Drop ``spec``'s subscription; raise, having dropped nothing, when it is in use or the publisher is unreachable."""
    slot = capture_names(spec.subscription)[0]
    names = ", ".join(capture_publication_names(spec.subscription).values())
    result = DropResult(spec.subscription, slot, names, keep_slot=keep_slot)
    change_log = open_change_log(spec)
    with ExitStack() as stack:
        sub = stack.enter_context(connect(spec.subscriber, "subscriber", spec))
        has_state = relation_exists(sub, "subscription")
        if has_state:
            stack.enter_context(_no_job_running(sub, spec.subscription))
        _no_capture_running(stack, sub, spec.subscription)
        _log_listable(change_log)
        tables = StateStore(sub, spec.subscription).tables() if has_state else []
        _origins_droppable(sub, spec.subscription, [r.table for r in tables])
        if not keep_slot:
            pub = stack.enter_context(_connect_publisher(spec, slot))
            dropped = drop_capture_objects(pub, spec.subscription)
            result.slot_dropped, result.slot_retained_bytes = dropped.slot_dropped, dropped.retained_bytes
            result.slot_invalidated = dropped.invalidated
            result.publication = ", ".join(dropped.publications)
            result.publication_dropped, result.left_alone = bool(dropped.publications), list(dropped.left_alone)
        if has_state:
            migrate(sub)  # drop_history, where the drop is remembered (a subscriber of an older release lacks it)
            with sub.transaction():
                if relation_exists(sub, "apply_stage"):
                    clear_stage(sub, spec.subscription)
                drop_stagings(sub, spec.subscription, [r.table for r in StateStore(sub, spec.subscription).tables()])
                state = StateStore(sub, spec.subscription).drop(kept_slot=keep_slot)
            # its replication origins, as DROP SUBSCRIPTION drops the worker's (and a killed copy's)
            drop_origin(sub, spec.subscription, [] if state is None else state.tables)
            if state is not None:
                result.state_dropped = True
                result.tables = [str(t) for t in state.tables]
                result.refreshes, result.batches = state.refreshes, state.batches
        try:
            moved = change_log.retire()
        except ChangeLogError as e:  # checked above; lost since: say what was dropped, and how to finish
            raise DropError(e.message, detail=f"{result.describe()}; the change log stays where it is",
                            hint="run the drop again once the store answers: it finishes the job (the change log "
                            "moved aside); or move or delete the log yourself") from e
        result.change_log_moved_to = None if moved is None else str(moved)
    log.info("subscription %s: %s", spec.subscription, result.describe())
    return result


def _log_listable(change_log: ChangeLog) -> None:
    """The drop's last step moves the change log aside: refuse, having dropped nothing, when it cannot even be listed
    (an object store without its connection's credentials, unreachable)."""
    try:
        change_log.segments()
    except ChangeLogError as e:
        raise DropError(e.message, detail="nothing was dropped: the drop moves the change log aside last, and "
                        "checks first that it can", hint=e.hint) from e


def _origins_droppable(sub: psycopg.Connection, subscription: str, tables: list[TableName]) -> None:
    """Refuse, having dropped nothing, when the subscription has replication origins the role may not drop: left
    behind, each would count against the cluster's max_active_replication_origins (PostgreSQL 18) for good."""
    names = undroppable_origins(sub, subscription, tables)
    if names:
        role = sub.execute("SELECT current_user").fetchone()[0]
        listed = ", ".join(names)
        raise DropError(f"role {role} may not drop the replication origin(s) {listed} of subscription "
                        f"{subscription!r}", detail="nothing was dropped: DROP SUBSCRIPTION drops its origins, and "
                        "one left behind counts against the subscriber cluster's max_active_replication_origins",
                        hint=f"GRANT EXECUTE ON FUNCTION {', '.join(FUNCTIONS)} TO {role} (as a superuser; "
                        f"docs/first-week.md), or drop them as a superuser first: "
                        + "; ".join(f"SELECT pg_replication_origin_drop('{n}')" for n in names))


@contextmanager
def _no_job_running(sub: psycopg.Connection, subscription: str) -> Iterator[None]:
    """Refuse while an apply, snapshot or resync holds its job lock; hold the apply's lock meanwhile."""
    def busy() -> DropError:
        return DropError(f"an apply of subscription {subscription!r} is running (PID "
                         f"{_holders(sub, *job_lock_key(subscription, APPLY_LOCK))} in the subscriber)",
                         hint=STOP_BEFORE_DROP)

    with job_lock(sub, subscription, APPLY_LOCK, busy):
        copying = _holders(sub, job_lock_key(subscription, "")[0])  # any table's copy or resync
        if copying:
            raise DropError(f"a snapshot or resync of subscription {subscription!r} is running (PID {copying} in the "
                            "subscriber)", hint=STOP_BEFORE_DROP)
        yield


def _holders(sub: psycopg.Connection, key1: str, key2: str | None = None) -> str:
    """PIDs of the other sessions holding a two-key advisory lock ``(key1, key2 or any)`` in this database."""
    rows = sub.execute(
        """SELECT DISTINCT pid FROM pg_locks
           WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND pid <> pg_backend_pid()
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND classid = hashtext(%s)::oid AND (%s::text IS NULL OR objid = hashtext(%s)::oid)
           ORDER BY pid""", (key1, key2, key2)).fetchall()
    return ", ".join(str(pid) for (pid,) in rows)


def _no_capture_running(stack: ExitStack, sub: psycopg.Connection, subscription: str) -> None:
    """Hold the capture's writer lock (publisher/writer_lock.py) while the log is moved aside; refuse while a
    capture holds it."""
    try:
        stack.enter_context(writer_lock_on(sub, subscription, "subscriber"))
    except ChangeLogError as e:
        raise DropError(f"a capture of subscription {subscription!r} is running (PID "
                        f"{holders(sub, subscription) or '?'} in the subscriber holds its change log)",
                        hint=STOP_BEFORE_DROP) from e


@contextmanager
def _connect_publisher(spec: SubscriptionSpec, slot: str) -> Iterator[psycopg.Connection]:
    try:
        conn = connect(spec.publisher, "publisher", spec)
    except CatalogError as e:
        raise DropError(f'could not connect to the publisher when attempting to drop replication slot "{slot}"',
                        detail=e.detail or e.message,
                        hint=f"`rowfilter drop --keep-slot` drops the subscriber side only (PostgreSQL: ALTER "
                        f"SUBSCRIPTION … SET (slot_name = NONE)); the slot then retains WAL on the publisher until "
                        f"`rowfilter drop` runs again with the publisher reachable, or until SELECT "
                        f"pg_drop_replication_slot('{slot}') there") from e
    with conn:
        yield conn
