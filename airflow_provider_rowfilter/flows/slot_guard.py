"""The slot guard: while the apply is paused or disabled, read the slot into the durable change log, applying nothing.

A native subscription's walsender reads its slot all day; ours is read only while an apply runs. A paused
apply DAG, or a subscription disabled for a maintenance (``rowfilter disable``), leaves the slot unread, and
the publisher invalidates an unread slot once ``idle_replication_slot_timeout`` passes (PostgreSQL 18) or once
the WAL it holds outgrows ``max_slot_wal_keep_size``: the tables would then need a repair (``refresh
--recreate-slot --reconcile``). The guard is one capture run (publisher/capture.py, what ``apply`` does before
it applies), bounded batches until everything the publisher had flushed when it started is in the log, under
the apply's lock, so that it never runs beside an apply (a running apply reads the slot itself: the guard
then does nothing). The slot moves on, its WAL is released, and the changes wait in the log; the next apply
applies them, exactly once, as it applies a batch a failed run left in the log (docs/change-log.md). Nothing
is copied again.

No Spark: the capture runs in this process, as the apply operator's own first steps do (it holds one fetch
and one row group at a time).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from airflow_provider_rowfilter.change_log.log import ChangeLogError
from airflow_provider_rowfilter.change_log.store import open_change_log
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.apply.plan import DEFAULT_MAX_CHANGES
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import ApplyBusyError, apply_lock
from airflow_provider_rowfilter.publisher.capture import capture
from airflow_provider_rowfilter.publisher.catalog_reader import flush_position
from airflow_provider_rowfilter.subscriber.state import StateStore

log = logging.getLogger(__name__)

#: Seconds one guard run may capture for (checked between captures: a capture is never cut).
DEFAULT_TIME_BUDGET = 240.0


@dataclass
class GuardResult:
    """What one guard run did (the operator's XCom)."""

    subscription: str
    #: why nothing was captured (not subscribed, an apply runs), else None
    skipped: str | None = None
    captures: int = 0
    changes: int = 0
    transactions: int = 0
    segments: list[str] = field(default_factory=list)
    start_lsn: str | None = None
    end_lsn: str | None = None
    caught_up: bool = False  # every transaction committed before the run started is in the log

    def summary(self) -> dict:
        return {"subscription": self.subscription, "skipped": self.skipped, "captures": self.captures,
                "changes": self.changes, "transactions": self.transactions, "segments": len(self.segments),
                "start_lsn": self.start_lsn, "end_lsn": self.end_lsn, "caught_up": self.caught_up}

    def describe(self) -> str:
        if self.skipped:
            return f"nothing captured: {self.skipped}"
        moved = f"{self.start_lsn} -> {self.end_lsn}" if self.start_lsn != self.end_lsn else f"at {self.end_lsn}"
        return (f"the slot was read ({moved}): {self.changes:,} change(s) in {self.transactions:,} transaction(s) "
                f"kept in the change log ({len(self.segments)} segment(s)) for the next apply"
                + ("" if self.caught_up else "; the time budget stopped it before it caught up"))


def guard_slot(spec: SubscriptionSpec, *, max_changes: int = DEFAULT_MAX_CHANGES,
               time_budget: float | None = DEFAULT_TIME_BUDGET) -> GuardResult:
    """Capture the slot into the change log until it reaches what the publisher had flushed when the run started
    (or ``time_budget`` is spent), applying nothing.

    Does nothing (``skipped``) when the subscription has no state in the subscriber, or when an apply of it
    runs (it holds the apply's lock, and reads the slot itself). Raises what the capture raises: a slot that is
    gone or invalidated, a change log that misses changes (each changes nothing).
    """
    result = GuardResult(spec.subscription)
    began = time.monotonic()
    with connect(spec.subscriber, "subscriber", spec) as sub:
        store = StateStore(sub, spec.subscription)
        if store.subscription_row() is None:
            result.skipped = f"subscription {spec.subscription!r} has no state in the subscriber (not subscribed yet, " \
                "or dropped)"
            return result
        recorded, here = store.log_needs().recorded, open_change_log(spec).identity()
        if recorded is None or here is None or here.id != recorded.id:
            # Never a log the apply does not read (a worker that sees another folder, or none): the changes would
            # leave the slot for a log nobody applies from (the apply's own rule: flows/apply/drain.py).
            result.skipped = (f"the change log at {open_change_log(spec).where} is not the one the subscriber records "
                              f"({'none yet' if recorded is None else recorded.location}): run the guard where the "
                              "apply's change log is seen")
            return result
        try:
            with apply_lock(sub, spec.subscription):
                _capture_all(spec, store, result, max_changes, time_budget, began)
        except ApplyBusyError:
            result.skipped = "an apply of the subscription runs: it reads the slot itself"
        except ChangeLogError as e:
            if "holds its change log" not in e.message:
                raise
            result.skipped = f"another capture reads the slot ({e.message})"
    if result.skipped is None:
        log.info("%s: %s", spec.subscription, result.describe())
    return result


def _capture_all(spec: SubscriptionSpec, store: StateStore, result: GuardResult, max_changes: int,
                 time_budget: float | None, began: float) -> None:
    with connect(spec.publisher, "publisher", spec) as pub:
        target = flush_position(pub)
    while True:
        captured = capture(spec, max_changes=max_changes, upto_lsn=format_lsn(target), needs=store.log_needs())
        result.captures += 1
        result.start_lsn = result.start_lsn or captured.start_lsn
        result.end_lsn = captured.end_lsn
        result.changes += captured.changes
        result.transactions += captured.transactions
        if captured.segment:
            result.segments.append(captured.segment)
        if not captured.more or parse_lsn(captured.end_lsn) >= target:
            result.caught_up = True
            return
        if time_budget is not None and time.monotonic() - began >= time_budget:
            return
