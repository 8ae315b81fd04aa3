"""A draining run's captures: the next batch's, read from the slot while this batch is applied."""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import Future, ThreadPoolExecutor

from airflow_provider_rowfilter.change_log.identity import LogNeeds
from airflow_provider_rowfilter.change_log.segment_writer import Hold
from airflow_provider_rowfilter.core.apply.plan import DEFAULT_MAX_CHANGES
from airflow_provider_rowfilter.core.lsn import format_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.flows.apply.change_rows import CHANGE_COLUMNS
from airflow_provider_rowfilter.flows.apply.reducers import COLUMNS_BATCH_CHANGES, IN_PROCESS_BATCH_CHANGES
from airflow_provider_rowfilter.publisher.capture import CaptureResult, capture
from airflow_provider_rowfilter.publisher.capture_objects import SlotMissingError
from airflow_provider_rowfilter.subscriber.state import StateStore, slot_lost

log = logging.getLogger(__name__)

#: What a capture keeps in memory of its segment for this process's reducer (flows/apply/reducers.py ``reduce_here``):
#: the columns the reducers read, of a segment of at most what is reduced in this process.
HOLD: Hold | None = Hold(COLUMNS_BATCH_CHANGES, CHANGE_COLUMNS)
#: A run without a bound of its own (no ``--max-changes``) captures its first batch at DEFAULT_MAX_CHANGES slot
#: rows, so that the apply starts soon; while a backlog waits, each capture ahead reads as many slot rows as
#: make about this many changes (by the last capture's share of changes among its slot rows: pgbench's
#: transactions are half Begin and Commit), at most BACKLOG_MAX_CHANGES slot rows: a batch still reduced in
#: this process by the walk (flows/apply/reducers.py IN_PROCESS_BATCH_CHANGES, with room for its last transaction),
#: with fewer batches' fixed costs and fewer re-reads of the WAL from the slot's restart_lsn (docs/benchmarks.md).
BACKLOG_BATCH_CHANGES = IN_PROCESS_BATCH_CHANGES * 9 // 10
BACKLOG_MAX_CHANGES = 4 * DEFAULT_MAX_CHANGES


class CaptureAhead:
    """A run's captures: each bounded batch's, ending at the first commit at or past the run's target, under
    the apply's lock, with what the tables need of the log (publisher/capture.py ``_check_log``).

    From the second batch of a draining run on, the next batch's capture runs in a thread of its own (its
    own publisher connection) while this batch is reduced and applied: the capture waits on the
    publisher's decoding and the apply on the subscriber, and each used to wait for the other. The
    tables' needs are read before it starts, on the run's subscriber connection; they only move
    forward, so the capture checks the log against positions at or behind the tables' own. What the
    apply writes is whole before the thread reads it and what the capture writes is invisible until it
    is renamed into the log (change_log/log.py), and segments are pruned only while no capture runs, so
    its continuity check never meets a segment being removed.

    Each capture also hands the apply its segment's rows as the writer wrote them into the file
    (``CaptureResult.held``, change_log/segment_writer.py ``Hold``), so that the reducer of this process takes
    them instead of reading the segment back; the file stays the durable copy, read by any run that did not
    capture it (a rerun after a crash between the write and the apply).
    """

    def __init__(self, spec: SubscriptionSpec, store: StateStore, max_changes: int | None) -> None:
        """:param max_changes: every capture's bound (slot rows); None: DEFAULT_MAX_CHANGES, then larger ones ahead
        while a backlog waits (:data:`BACKLOG_BATCH_CHANGES`)."""
        self.spec, self.store, self.fixed = spec, store, max_changes
        #: the bound of the capture :meth:`take` returned last (what its batch applies of the log: flows/apply/drain.py)
        self.max_changes = DEFAULT_MAX_CHANGES if max_changes is None else max_changes
        self._ahead = self.max_changes  # the bound of the capture running ahead
        self.pending: Future[CaptureResult] | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def running(self) -> bool:
        return self.pending is not None

    def start(self, target: int | None, last: CaptureResult | None = None) -> None:
        """Start the next batch's capture; ``last``: the capture just taken, whose share of changes sizes it."""
        self._ahead = self.max_changes if self.fixed is not None else backlog_bound(last)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"rowfilter-capture-{self.spec.subscription}")
        # In the run's context: what connection.py ``in_task`` handed the run (the passwords of an operator's
        # task) is a context variable, which a thread of the pool would not see otherwise.
        self.pending = self._pool.submit(contextvars.copy_context().run, self._capture, target, self.store.log_needs(),
                                         self._ahead)

    def take(self, target: int | None) -> CaptureResult:
        """The batch's capture: the one started ahead, else one now."""
        pending, self.pending = self.pending, None
        self.max_changes = (DEFAULT_MAX_CHANGES if self.fixed is None else self.fixed) if pending is None else self._ahead
        try:
            return self._capture(target, self.store.log_needs(), self.max_changes) if pending is None \
                else pending.result()
        except SlotMissingError as e:
            # Tables past i hold positions read from the lost slot: refresh alone refuses, the
            # fix is a new slot and a new copy of them (refresh --recreate-slot).
            stranded = [r for r in self.store.tables() if r.state is not SyncState.INIT]
            if stranded:
                raise slot_lost(self.spec, e.slot, stranded) from None
            raise

    def finish(self) -> None:
        """Wait for a capture still running (its segment stays in the log for the next run)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception as e:  # the run already fails or stops for its own reason
                log.warning("the capture ahead of the next batch failed too: %s", e)
        if self._pool is not None:
            self._pool.shutdown()

    def _capture(self, target: int | None, needs: LogNeeds, max_changes: int) -> CaptureResult:
        return capture(self.spec, max_changes=max_changes,
                       upto_lsn=None if target is None else format_lsn(target), needs=needs, hold=HOLD)


def backlog_bound(last: CaptureResult | None) -> int:
    """The slot rows of a capture ahead while a backlog waits: about :data:`BACKLOG_BATCH_CHANGES` changes at
    ``last``'s share of changes among its slot rows, from DEFAULT_MAX_CHANGES to :data:`BACKLOG_MAX_CHANGES`."""
    if last is None or not last.messages or not last.changes:
        return DEFAULT_MAX_CHANGES
    rows = BACKLOG_BATCH_CHANGES * last.messages // last.changes
    return max(DEFAULT_MAX_CHANGES, min(rows, BACKLOG_MAX_CHANGES))
