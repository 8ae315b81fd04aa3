"""One capture: a bounded batch of the subscription's slot moved into a durable change-log segment (jobs/capture.py).

When the spec names a subscriber, what its tables still need of the log is read there first, and the capture
refuses, changing nothing, when the log misses any of it (publisher/capture.py ``_check_log``); without one, the
log may only not be behind the slot. The apply captures ahead of its batches itself (flows/apply/capture_ahead.py).
"""

from __future__ import annotations

from airflow_provider_rowfilter.change_log.segment_writer import DEFAULT_ROW_GROUP_ROWS
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.publisher.capture import (
    DEFAULT_FETCH_ROWS,
    DEFAULT_MAX_CHANGES,
    CaptureResult,
    capture,
)
from airflow_provider_rowfilter.subscriber.state import StateStore


def capture_once(spec: SubscriptionSpec, *, max_changes: int = DEFAULT_MAX_CHANGES, upto_lsn: str | None = None,
                 row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, fetch_rows: int = DEFAULT_FETCH_ROWS) -> CaptureResult:
    """Capture one bounded batch, held against what the spec's subscriber (if any) needs of the log."""
    needs = None
    if spec.subscriber:
        with connect(spec.subscriber, "subscriber", spec) as sub:
            needs = StateStore(sub, spec.subscription).log_needs()
    return capture(spec, max_changes=max_changes, upto_lsn=upto_lsn, row_group_rows=row_group_rows,
                   fetch_rows=fetch_rows, needs=needs)
