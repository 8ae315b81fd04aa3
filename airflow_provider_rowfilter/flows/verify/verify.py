"""Verify: each table of a subscription compared with its publisher's rows at one consistent point (``rowfilter verify``).

The point is an LSN X: the consistent point of a temporary slot whose exported snapshot the publisher's
readers share, as the initial copy's readers do (publisher/copy_source.py ``exported_snapshot``). The
subscriber is brought to exactly X first, under the apply's lock taken on the job's own session (a running
batch is waited for; no other run starts meanwhile): the slot is captured up to X (publisher/capture.py:
every transaction committed before X, none after) and the log is applied on that session
(flows/apply/drain.py, advisory locks being re-entrant), so every table's position is X. A repeatable-read
transaction then exports the subscriber's snapshot, in which the rows are the subscriber's as of X, and
the lock is released: later batches go on being applied while the comparison reads the two snapshots.

Each table's rows under its effective copy filter and column list (the initial copy's query) are then
compared with the subscriber's, bucket by bucket, hashed in the databases, and row by row only inside the
buckets that differ (flows/verify/comparison.py). Nothing is written to either side's tables; each table's result is
kept in ``rowfilter.table_check`` (``status``). Exit 0 when every compared table is equal, 1 when one differs.
A table not copied yet (``i``, ``d``) has nothing to compare and is listed as such.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_rowfilter.connection import connect, is_transient
from airflow_provider_rowfilter.core.compare.table_compare import TableCheck
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.verify.comparison import Engines, Sides, bucket_pass, check_of, plan_table, row_diff
from airflow_provider_rowfilter.publisher.capture_objects import SlotMissingError
from airflow_provider_rowfilter.publisher.copy_source import ExportedSnapshot, exported_snapshot
from airflow_provider_rowfilter.publisher.definitions import Definitions, load_definitions
from airflow_provider_rowfilter.subscriber.compare_target import exported_positions, native_subscriptions_of
from airflow_provider_rowfilter.subscriber.copy_target import executor_conninfo
from airflow_provider_rowfilter.subscriber.state import (
    APPLIED,
    APPLY_LOCK,
    RelState,
    StateStore,
    job_lock,
    migrate,
    slot_lost,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Seconds a verify waits for a running apply to end before it takes the point.
LOCK_WAIT = 600.0
#: Most readers of one side of one table's bucket pass.
MAX_READERS = 8


class VerifyError(RowFilterError):
    """A verify could not compare (it changed nothing)."""


class SubscriptionDisabledError(VerifyError):
    """The subscription is disabled: nothing brings its tables to the verify's point."""


class ApplyRunningError(VerifyError):
    transient = True  # a later run finds the apply done


class DifferencesFound(RowFilterError):
    """A verify found a table that differs from its publisher's rows."""


@dataclass
class VerifyResult:
    """A verify's tables: what the job prints and the XCom holds."""

    subscription: str
    lsn: str | None = None
    tables: list[TableCheck] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return all(t.clean for t in self.tables if t.checked)

    @property
    def differing(self) -> list[TableCheck]:
        return [t for t in self.tables if t.checked and not t.clean]

    def summary(self) -> dict:
        return {"subscription": self.subscription, "lsn": self.lsn, "clean": self.clean,
                "seconds": round(self.seconds, 3), "tables": [t.as_dict() for t in self.tables]}

    def error(self, *, details: bool = True) -> DifferencesFound:
        """The tables that differ; ``details``: with each one's counts and example keys (False: their names only,
        where they were printed already: ``rowfilter verify``)."""
        listed = (":\n  " + "\n  ".join(t.describe().replace("\n", "\n  ") for t in self.differing)) if details \
            else ": " + ", ".join(t.table for t in self.differing)
        return DifferencesFound(
            f"{len(self.differing)} table(s) of subscription {self.subscription!r} differ from the publisher's rows "
            f"at {self.lsn}" + listed,
            hint="`rowfilter reconcile --table T` brings a table to what a new copy would hold, in place (--dry-run "
            "shows what it would change); docs/verify.md says which repair fits which cause")


def why_not_compared(rel: RelState, definitions: Definitions) -> str | None:
    """Why a table has nothing to compare (None: it has)."""
    if rel.reconciling:
        return "a reconcile holds it in state d: run `rowfilter reconcile` for it to finish"
    if rel.state not in APPLIED or rel.lsn is None:
        return f"state {rel.state.value} ({rel.state.label}): its initial copy has not finished"
    if rel.table in definitions.filters.refused:
        return f"refused by refresh: {definitions.filters.refused[rel.table]}"
    if rel.table not in definitions.filters.tables:
        return "no publication of the subscription publishes it now: run `rowfilter refresh`"
    return None


def verify(spec: SubscriptionSpec, tables: Sequence[TableName] | None = None, *, spark: SparkSession | None = None,
           max_readers: int = MAX_READERS, lock_wait: float = LOCK_WAIT, record: bool = True) -> VerifyResult:
    """Compare each chosen table with its publisher's rows at one consistent point (read-only on both sides).

    :param record: keep each table's result in ``rowfilter.table_check`` (False: ``reconcile --dry-run``).
    """
    began = time.monotonic()
    result = VerifyResult(spec.subscription)
    with connect(spec.subscriber, "subscriber", spec) as sub, connect(spec.publisher, "publisher", spec) as pub, \
            Engines(spec, "verify", spark) as engines, ExitStack() as held:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        enabled = store.require_subscription().enabled
        chosen = [r.table for r in store.chosen_tables(tables)]
        definitions = load_definitions(spec, pub)
        rels = store.tables(chosen)
        wanted = {r.table for r in rels if why_not_compared(r, definitions) is None}
        if wanted and not enabled:
            raise SubscriptionDisabledError(
                f"subscription {spec.subscription!r} is disabled (`rowfilter disable`): a verify cannot bring its "
                "tables to one point with the publisher",
                detail="a verify applies the change log up to the publisher's snapshot before it compares (the apply's "
                "own batches, on its session), and a disabled subscription applies nothing until it is enabled. "
                "Nothing was compared or changed",
                hint="`rowfilter enable --spec …`, then run the verify again; `rowfilter reconcile` (not --dry-run) "
                "repairs while it is disabled (from a snapshot of its own; the apply replays the rest once enabled)")
        if wanted:
            pub_snapshot, sub_snapshot, rels = consistent_point(spec, store, wanted, held, engines, lock_wait)
            rels = [r for r in rels if r.table in chosen]
            result.lsn = pub_snapshot.lsn
            app = f"rowfilter:{spec.subscription}:verify"
            sides = Sides(executor_conninfo(spec.publisher, "publisher", app),
                          executor_conninfo(spec.subscriber, "subscriber", app), pub_snapshot, sub_snapshot)
        for rel in rels:
            note = why_not_compared(rel, definitions)
            if note is not None:
                result.tables.append(TableCheck(str(rel.table), note=note))
            else:
                result.tables.append(compare(spec, sub, pub, store, rel.table, definitions, sides, engines,
                                             max_readers))
        if record:
            with sub.transaction():
                for check in result.tables:
                    if check.checked:
                        store.record_check(TableName.parse(check.table), "verify", check.lsn, check.clean,
                                           check.as_dict())
    result.seconds = time.monotonic() - began
    for check in result.tables:  # said once: by the caller (the CLI's lines, the job's JSON and error)
        log.info("%s", check.describe())
    return result


def compare(spec: SubscriptionSpec, sub, pub, store: StateStore, table: TableName, definitions: Definitions,
            sides: Sides, engines: Engines, max_readers: int) -> TableCheck:
    """One table's comparison: the bucket pass, then the rows of the differing buckets."""
    began = time.monotonic()
    filters = definitions.filters.tables[table]
    plan = plan_table(pub, sub, spec.subscription, filters, definitions.catalog.relation(table),
                      max_readers=max_readers, rerun="run the verify again")
    engine = engines.for_pages(plan.pages)
    log.info("%s: comparing rows where %s, columns %s, %s, in %d ranges", table,
             plan.source.filter_sql or "TRUE (no filter)", ", ".join(plan.source.columns), plan.shape.describe(),
             plan.buckets.count)
    found = bucket_pass(plan, sides, engine)
    check = check_of(plan, found, sides.publisher_snapshot.lsn)
    check.take(row_diff(plan, sides, found, engines.for_rows(found.differing_rows, engine)))
    check.shared_with = store.other_subscriptions_of(table) + native_subscriptions_of(sub, table)
    if check.shared_with and check.extra:
        log.warning("%s: subscription(s) %s replicate into this table too: its extra rows may be theirs", table,
                    ", ".join(check.shared_with))
    check.seconds = time.monotonic() - began
    return check


# --- the consistent point --------------------------------------------------------------------------------
def consistent_point(spec: SubscriptionSpec, store: StateStore, wanted: set[TableName], held: ExitStack,
                     engines: Engines, lock_wait: float) -> tuple[ExportedSnapshot, ExportedSnapshot, list[RelState]]:
    """A publisher snapshot at X and a subscriber snapshot in which every ``wanted`` table is at X (both held open
    by ``held``), and the tables as that snapshot sees them.

    Under the apply's lock, taken on the job's own subscriber session: the snapshot, the capture up to X, the
    apply of the log on that same session (advisory locks are re-entrant, so no other run can capture past X
    or apply meanwhile), and the subscriber's snapshot. The lock is released before the comparison: later
    batches are applied while it reads the snapshots.
    """
    with applies_paused(store, lock_wait):
        snapshot = held.enter_context(exported_snapshot(
            connect(spec.publisher, "publisher", spec, replication="database")))
        capture_through(spec, store, snapshot.lsn)
        apply_log(spec, store, engines)
        conn = held.enter_context(connect(spec.subscriber, "subscriber", spec))
        sub_snapshot_id, rels = held.enter_context(exported_positions(conn, spec.subscription))
        sub_snapshot = ExportedSnapshot(sub_snapshot_id, "", "")  # the subscriber's: no slot, no LSN of its own
    moved = [r for r in rels if r.table in wanted and r.state in APPLIED
             and (r.lsn is None or parse_lsn(r.lsn) != parse_lsn(snapshot.lsn))]
    if moved:  # a copy committed its f meanwhile (a snapshot job does not take the apply's lock)
        raise VerifyError(f"subscription {spec.subscription!r}: {', '.join(str(r.table) for r in moved)} moved past the "
                          f"verify's point {snapshot.lsn} while it was taken ("
                          + ", ".join(f"{r.state.value} at {r.lsn}" for r in moved) + ")",
                          hint="run the verify again once the initial copy has finished")
    log.info("subscription %s: both sides held at %s", spec.subscription, snapshot.lsn)
    return snapshot, sub_snapshot, rels


def applies_paused(store: StateStore, wait: float):
    """The apply's job lock on the job's session, waited for up to ``wait`` seconds (a running batch ends on its own)."""
    return job_lock(store.conn, store.subscription, APPLY_LOCK, lambda: ApplyRunningError(
        f"an apply of subscription {store.subscription!r} has been running for more than {wait:.0f} s",
        hint="run the verify again when it has ended"), wait=wait)


def capture_through(spec: SubscriptionSpec, store: StateStore, lsn: str) -> None:
    """Capture the slot into the change log up to ``lsn``: every transaction committed before it, none after
    (``upto_lsn``: pg_logical_slot_peek_binary_changes stops after the first record ending at or past it,
    logicalfuncs.c ``pg_logical_slot_get_changes_guts``). Under the apply's lock."""
    from airflow_provider_rowfilter.publisher.capture import capture

    target = parse_lsn(lsn)
    while True:
        try:
            captured = capture(spec, upto_lsn=lsn, needs=store.log_needs())
        except SlotMissingError as e:
            stranded = [r for r in store.tables() if r.state.value != "i"]
            raise slot_lost(spec, e.slot, stranded) if stranded else e from None
        if not captured.more or parse_lsn(captured.end_lsn) >= target:
            return


def apply_log(spec: SubscriptionSpec, store: StateStore, engines: Engines) -> None:
    """Apply what the change log holds (up to the point just captured) on the job's session, which holds the
    apply's lock: every table's position becomes the point."""
    from airflow_provider_rowfilter.flows.apply.drain import apply

    try:
        apply(spec, capture_first=False, spark=engines.session, subscriber=store.conn)
    except RowFilterError as e:  # a conflict, a changed publication: the subscriber cannot reach the point
        if is_transient(e):
            raise  # a lost connection: exit 75, the run is retried
        raise VerifyError(f"cannot bring subscription {spec.subscription!r} to the verify's point: the apply "
                          f"failed: {e.message}", table=e.table, detail=e.detail,
                          hint=(e.hint + "; " if e.hint else "") + "then run the verify again") from e
