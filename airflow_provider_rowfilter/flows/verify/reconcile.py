"""Reconcile: each table brought in place to what a new initial copy under the current definitions would hold.

Where the project would empty a table and copy it again (a changed filter or column list, a lost slot, a
resync), a reconcile keeps the table readable and writes only what differs. Per table:

1. **Hold.** One subscriber transaction moves the table to ``d``, marked as a reconcile (``status`` shows
   it): the apply leaves a table in ``d`` alone, as PostgreSQL's apply worker leaves a table whose sync
   runs, and keeps the change log from its position on (flows/apply/drain.py ``_prune``).
2. **Snapshot.** A temporary slot exports the publisher's snapshot at its consistent point X, as the
   initial copy's does (publisher/copy_source.py); as the copy, nothing read at X is written before the
   standbys of ``synchronized_standby_slots`` have confirmed X (publisher/failover.py), and the hold
   waits for them too.
3. **Compare and fix.** The bucket pass of a verify (flows/verify/comparison.py) finds the key ranges that differ;
   each group of them is fixed in ONE subscriber transaction (subscriber/reconcile_target.py: missing rows
   inserted, extra ones deleted, different ones updated), which brings the group to exactly the publisher's
   rows at X whatever it held before.
4. **Hand back.** One transaction moves the table to ``f`` at X, keeps the result (``rowfilter.table_check``)
   and the counts (``batch_history``, kind ``reconcile``). The apply replays the changes committed from X
   on, exactly as after an initial copy whose snapshot was X: the table now holds a copy at X.

The table is never empty, and only behind (not wrong) while held. Killed anywhere, a rerun finds it held
and does steps 2 to 4 again with a new snapshot: every group ends at the new X whatever an earlier run
fixed. ``--dry-run`` changes nothing: it verifies (flows/verify/verify.py) and says what would change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.compare.table_compare import GROUP_ROWS, TableCheck
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.flows.verify.comparison import Engines, Sides, bucket_pass, check_of, group_fixes, plan_table
from airflow_provider_rowfilter.flows.verify.verify import LOCK_WAIT, MAX_READERS, verify
from airflow_provider_rowfilter.publisher.capture_objects import current_lsn
from airflow_provider_rowfilter.publisher.copy_source import exported_snapshot
from airflow_provider_rowfilter.publisher.definitions import Definitions, load_definitions
from airflow_provider_rowfilter.publisher.failover import confirmed_timeline, wait_for_standbys
from airflow_provider_rowfilter.subscriber.compare_target import native_subscriptions_of
from airflow_provider_rowfilter.subscriber.copy_target import executor_conninfo
from airflow_provider_rowfilter.subscriber.reconcile_target import GroupCounts
from airflow_provider_rowfilter.subscriber.replica_role import replica_role
from airflow_provider_rowfilter.subscriber.state import RelState, StateStore, job_lock, migrate

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class ReconcileError(RowFilterError):
    """A table could not be reconciled (a table held by it stays held: run the reconcile again)."""


@dataclass
class ReconcileResult:
    subscription: str
    tables: list[TableCheck] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> dict:
        return {"subscription": self.subscription, "ok": self.ok, "dry_run": self.dry_run,
                "seconds": round(self.seconds, 3), "tables": [t.as_dict() for t in self.tables],
                "errors": self.errors}

    def error(self) -> ReconcileError:
        return ReconcileError(
            f"the reconcile of {len(self.errors)} table(s) of subscription {self.subscription!r} failed:\n  "
            + "\n  ".join(f"{t}: {e}" for t, e in self.errors.items()),
            hint="fix the cause and run `rowfilter reconcile` again: a table it holds in state d (status says so) "
            "is compared and fixed again from a new snapshot; the others are as they were")


def reconcile(spec: SubscriptionSpec, tables: Sequence[TableName] | None = None, *, spark: SparkSession | None = None,
              max_readers: int = MAX_READERS, dry_run: bool = False, lock_wait: float = LOCK_WAIT,
              group_rows: int = GROUP_ROWS) -> ReconcileResult:
    """Reconcile each chosen table in place (every table of the subscription by default).

    :param group_rows: about how many rows of differing key ranges one transaction fixes.
    """
    began = time.monotonic()
    if dry_run:
        checked = verify(spec, tables, spark=spark, max_readers=max_readers, lock_wait=lock_wait, record=False)
        return ReconcileResult(spec.subscription, checked.tables, dry_run=True, seconds=time.monotonic() - began)
    result = ReconcileResult(spec.subscription)
    with connect(spec.subscriber, "subscriber", spec) as sub, connect(spec.publisher, "publisher", spec) as pub, \
            Engines(spec, "reconcile", spark) as engines:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        store.require_subscription()
        rels = store.chosen_tables(tables)
        definitions = load_definitions(spec, pub)
        job = _Reconcile(spec, store, pub, definitions, engines, max_readers, group_rows)
        for rel in rels:
            try:
                result.tables.append(job.table(rel))
            except Exception as e:  # recorded on the table; the other tables go on
                from airflow_provider_rowfilter.flows.table_sync.table_copy import describe

                message = describe(e)
                log.error("%s: reconcile failed: %s", rel.table, message)
                if not sub.broken:
                    if sub.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        sub.rollback()
                    store.record_error(rel.table, f"reconcile failed: {message}")
                result.errors[str(rel.table)] = message
    result.seconds = time.monotonic() - began
    return result


def hold(store: StateStore, table: TableName, state: SyncState) -> None:
    """Move ``table`` to ``d`` for a reconcile (from any state: a table copied or applied goes by ``i``, as a resync
    sends it), in the caller's transaction; its rows stay."""
    if state is not SyncState.DATA_COPY:
        store.set_state(table, SyncState.INIT, resync=True)
    store.set_state(table, SyncState.DATA_COPY, reconcile=True)


class _Reconcile:
    def __init__(self, spec: SubscriptionSpec, store: StateStore, pub: psycopg.Connection, definitions: Definitions,
                 engines: Engines, max_readers: int, group_rows: int) -> None:
        self.spec, self.store, self.pub, self.definitions = spec, store, pub, definitions
        self.engines, self.max_readers, self.group_rows = engines, max_readers, group_rows
        app = f"rowfilter:{spec.subscription}:reconcile"
        self.source = executor_conninfo(spec.publisher, "publisher", app)
        self.target = executor_conninfo(spec.subscriber, "subscriber", app)

    def table(self, rel: RelState) -> TableCheck:
        sub, table = self.store.conn, rel.table
        with job_lock(sub, self.spec.subscription, str(table), lambda: ReconcileError(
                f"table {table} is being copied, resynced or reconciled by another job", table=str(table),
                hint="wait for that job to end, then run this one again")):
            (rel,) = self.store.tables([table])  # again, under the lock
            refused = self._refused(rel)
            if refused is not None:
                return TableCheck(str(table), note=refused, kind="reconcile")
            return self._locked(rel)

    def _refused(self, rel: RelState) -> str | None:
        if rel.state is SyncState.INIT:
            return "state i: not copied yet; the snapshot copies it with the current definitions"
        if rel.state is SyncState.DATA_COPY and not rel.reconciling:
            return "state d: its initial copy did not finish; the snapshot copies it again"
        if rel.table in self.definitions.filters.refused:
            raise ReconcileError(f"refused by refresh: {self.definitions.filters.refused[rel.table]}", table=str(rel.table))
        if rel.table not in self.definitions.filters.tables:
            raise ReconcileError("no publication of the subscription publishes it now", table=str(rel.table),
                                 hint="run `rowfilter refresh`: it removes the table from the subscription")
        return None

    def _locked(self, rel: RelState) -> TableCheck:
        began = time.monotonic()
        sub, table = self.store.conn, rel.table
        filters = self.definitions.filters.tables[table]
        relation = self.definitions.catalog.relation(table)
        rerun = f"run `rowfilter reconcile --table {table.as_sql()}` again"
        # Every check before the table changes: a target that cannot take the rows leaves it as it was.
        plan = plan_table(self.pub, sub, self.spec.subscription, filters, relation, max_readers=self.max_readers,
                          rerun=rerun)
        others = self.store.other_subscriptions_of(table) + native_subscriptions_of(sub, table)
        if others:
            raise ReconcileError(
                f"subscription(s) {', '.join(others)} replicate into this table too: a reconcile would delete "
                "their rows as extra", table=str(table),
                hint="verify it (`rowfilter verify` lists what differs), or reconcile into a table of its own")
        engine = self.engines.for_pages(plan.pages)  # Spark, if needed, starts before the table changes
        # Failover: a standby of synchronized_standby_slots that does not confirm the publisher's WAL now would not
        # confirm the snapshot's either: say so before the table is held (publisher/failover.py).
        wait_for_standbys(self.pub, current_lsn(self.pub))
        with sub.transaction():
            hold(self.store, table, rel.state)
        faults.point("reconcile-after-hold")
        log.info("%s: held in state d for the reconcile (was %s); the apply leaves it alone until it is done",
                 table, rel.state.value)
        with ExitStack() as held:
            # After the hold: creating the slot waits for every transaction with an xid in its cluster
            # (SnapBuildWaitSnapshot in snapbuild.c), ours included when both sides share one.
            snapshot = held.enter_context(exported_snapshot(
                connect(self.spec.publisher, "publisher", self.spec, replication="database")))
            # No row read at X is written, and X is not recorded, before the standbys have confirmed X: a promoted
            # standby then has every row and the position the table gets (as the initial copy waits).
            timeline = confirmed_timeline(self.pub, snapshot.lsn)
            sides = Sides(self.source, self.target, snapshot, None)
            found = bucket_pass(plan, sides, engine)
            check = check_of(plan, found, snapshot.lsn, kind="reconcile")
            fixes = group_fixes(plan, found, self.group_rows)
            log.info("%s: %d of %d ranges differ at %s; fixing them in %d transaction(s)", table,
                     check.differing_buckets, check.buckets, snapshot.lsn, len(fixes))
            done: list[GroupCounts] = []

            def each(counts: GroupCounts) -> None:
                done.append(counts)
                check.inserted += counts.inserted
                check.updated += counts.updated
                check.deleted += counts.deleted
                faults.point("reconcile-mid-groups")

            with sub.transaction():
                replica_role(sub, "reconcile", table)  # says once here when the role may not: the groups do the same
            self.engines.for_rows(found.differing_rows, engine).fixes(self.source, snapshot, self.target, fixes, each)
        faults.point("reconcile-before-finish")
        check.seconds = time.monotonic() - began
        with sub.transaction():
            self.store.set_state(table, SyncState.FINISHED_COPY, lsn=check.lsn, rows_copied=check.publisher_rows,
                                 timeline=timeline)
            self.store.record_check(table, "reconcile", check.lsn, True, check.as_dict())
            counts = {k: v for k, v in (("insert", check.inserted), ("update", check.updated),
                                        ("delete", check.deleted)) if v}
            self.store.record_reconcile(check.lsn or "0/0", {str(table): counts}, round(check.seconds * 1000),
                                        sum(counts.values()))
        log.info("%s", check.describe())
        log.info("%s: state f at %s: the apply replays the changes committed from there on", table, check.lsn)
        return check
