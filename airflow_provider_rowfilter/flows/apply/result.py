"""What an apply did: one batch, or a run of them (the job's JSON line, the CLI's report, the operator's XCom)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class ApplyResult:
    """What one batch did, or (:meth:`add`) what a run of batches did: the JSON line, the CLI's report.

    For a run: ``start_lsn`` is its first batch's, ``end_lsn``, ``batch_id``, ``states``, the lag and
    ``capture`` its last batch's; ``segments``, ``transactions``, ``changes`` and ``tables`` (per
    table and count) are totals over its batches. ``batch_history`` keeps each batch's own.
    """

    subscription: str
    start_lsn: str | None = None
    end_lsn: str | None = None
    segments: int = 0
    transactions: int = 0
    changes: int = 0
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    skipped_lsn: str | None = None
    lag_bytes: int | None = None  # from the last capture: the publisher's WAL past what the slot confirmed
    lag_seconds: float | None = None  # from the last capture: age of the last transaction captured
    duration_ms: int = 0
    batch_id: int | None = None
    capture: dict | None = None
    batches: int = 0  # batches recorded in batch_history by this run
    batch_ids: list[int] = field(default_factory=list)
    target_lsn: str | None = None  # the publisher's WAL flush position when the run started: what it drains to
    drained: bool = False  # everything committed before target_lsn (or, without a capture, logged) is applied
    budget_exhausted: bool = False  # the time budget stopped the run before it drained
    time_budget: float | None = None  # seconds
    disabled: bool = False  # the subscription is disabled (ALTER SUBSCRIPTION … DISABLE): nothing was applied
    #: schema_changes: follow: what the batches changed in the subscriber's tables ("public.t: added column …")
    schema_changes: list[str] = field(default_factory=list)

    @property
    def changed_tables(self) -> list[str]:
        return sorted(t for t, c in self.tables.items()
                      if any(c.get(k) for k in ("insert", "update", "delete", "truncate")))

    def summary(self) -> dict:
        return {**asdict(self), "changed_tables": self.changed_tables}

    def add(self, batch: ApplyResult) -> None:
        """Count ``batch`` (one of this run's) into the run's totals."""
        if batch.capture is not None:
            self.capture, self.lag_bytes, self.lag_seconds = batch.capture, batch.lag_bytes, batch.lag_seconds
        if batch.states:
            self.states = batch.states
        if batch.batch_id is None:
            return
        self.batches += 1
        self.batch_ids.append(batch.batch_id)
        self.batch_id, self.end_lsn = batch.batch_id, batch.end_lsn
        self.start_lsn = self.start_lsn or batch.start_lsn
        self.segments += batch.segments
        self.transactions += batch.transactions
        self.changes += batch.changes
        self.skipped_lsn = batch.skipped_lsn or self.skipped_lsn
        self.schema_changes += batch.schema_changes
        for table, counts in batch.tables.items():
            self.tables[table] = dict(Counter(self.tables.get(table, {})) + Counter(counts))

    @property
    def span(self) -> str:
        """The batch's changes in words, for an error about it."""
        return batch_span(self.start_lsn, self.end_lsn)


def batch_span(start_lsn: str | None, end_lsn: str | None) -> str:
    """``of the changes after <start> through <end>``, or ``before any change was read``."""
    if start_lsn is None:
        return "before any change was read"
    return f"of the changes after {start_lsn} through {end_lsn}"
