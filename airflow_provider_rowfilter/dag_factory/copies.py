"""The initial copies of a DAG: the tables waiting for theirs, one mapped snapshot task each, bounded by a pool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import task
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.hooks.subscription_rel import SubscriptionRelHook, parse_tables
from airflow_provider_rowfilter.operators.snapshot_copy import SnapshotCopyOperator

#: The states a table waits for its initial copy in (``d``: a copy that did not finish).
WAITING_FOR_COPY = (SyncState.INIT, SyncState.DATA_COPY)


def tables_waiting_for_copy(subscription: str, subscriber_conn_id: str,
                            tables: Sequence[str] | str | None = None) -> list[str]:
    """The subscription's tables (or the chosen ones) in ``i`` or ``d``: one snapshot task each.

    Read from ``rowfilter.subscription_rel`` through the subscriber's Airflow connection; a table
    named that the subscription does not have, or a subscription without state, fails without retry.
    """
    try:
        chosen = parse_tables(tables)
        reading = SubscriptionRelHook(subscriber_conn_id, subscription).read_state()
    except RowFilterError as e:
        raise AirflowFailException(str(e)) from e
    if not reading.exists:
        raise AirflowFailException(f"subscription {subscription!r} has no state in the subscriber; "
                                   "run its refresh first")
    states = {r.table: r.state for r in reading.tables}
    unknown = [str(t) for t in chosen or () if t not in states]
    if unknown:
        raise AirflowFailException(f"table(s) {', '.join(unknown)} not part of subscription {subscription!r} "
                                   f"(its tables: {', '.join(str(t) for t in sorted(states)) or 'none'})")
    # As SQL names (quoted where needed): the snapshot task reads them back as SQL (TableName.from_sql).
    return [t.as_sql() for t in sorted(chosen or states) if states[t] in WAITING_FOR_COPY]


def copy_tasks(*, pool: str, tables: Any, subscription: str, subscriber_conn_id: str,
               **job_kwargs: Any) -> Any:
    """``tables_to_copy`` and the mapped ``snapshot`` after it (call inside a DAG); returns both.

    One snapshot task per table waiting for its copy, each taking one slot of ``pool``: the pool's
    size is how many tables are copied at once (across every DAG that uses it).
    """
    listed = task(task_id="tables_to_copy")(tables_waiting_for_copy)(
        subscription=subscription, subscriber_conn_id=subscriber_conn_id, tables=tables)
    snapshot = SnapshotCopyOperator.partial(
        task_id="snapshot", pool=pool, map_index_template="{{ task.tables }}",
        subscription=subscription, subscriber_conn_id=subscriber_conn_id, **job_kwargs,
    ).expand(tables=listed)
    return listed, snapshot
