"""Whether an apply has a subscription to serve: not yet subscribed, dropped, disabled, or there.

A scheduled incremental sync is unpaused from its creation (the DAG factory's default), so its first
runs may come before the initial sync made the subscription, and its runs go on after the
subscription was dropped (an Airflow 3 task cannot pause a DAG: the Execution API has no such call).
Neither is a failure to alert on, and "run refresh first" would make anew what was just dropped, so
such a run is **skipped**, saying why. A subscription without state whose slot still exists on the
publisher is not skipped: the state was lost, or the connection names the wrong database, while the
slot holds WAL; that fails, as before. ``rowfilter disable`` (PostgreSQL's ``ALTER SUBSCRIPTION …
DISABLE``) skips the runs too, until ``rowfilter enable``.
"""

from __future__ import annotations

import psycopg
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec
from airflow_provider_rowfilter.publisher.capture_objects import capture_names
from airflow_provider_rowfilter.publisher.slot_health import read_slot
from airflow_provider_rowfilter.subscriber.state_reader import StateReader


def skip_unless_subscribed(resolved: ResolvedSpec, initial_sync: str | None = None) -> None:
    """Raise :class:`AirflowSkipException` (with the reason) when ``resolved``'s subscription is not there to
    apply to, or is disabled; return when it is. ``initial_sync`` names the DAG that subscribes (factory DAGs).

    What cannot be read is left to the apply, which fails or retries with its own error.
    """
    name = resolved.spec.subscription
    try:
        with resolved.connect("subscriber") as conn:
            reader = StateReader(conn, name)
            row = reader.subscription_row()
            drop = reader.last_drop() if row is None else None
    except (RowFilterError, psycopg.Error):
        return
    if row is not None:
        if not row.enabled:
            raise AirflowSkipException(
                f"subscription {name!r} is disabled (ALTER SUBSCRIPTION … DISABLE: `rowfilter disable`): nothing is "
                "applied until it is enabled again (`rowfilter enable`); its slot keeps the changes meanwhile")
        return
    if drop is not None:
        raise AirflowSkipException(
            f"subscription {name!r} was dropped at {drop.dropped_at:%Y-%m-%d %H:%M:%S %Z}: nothing to apply. Remove its "
            "spec file (or pause this DAG) to stop these runs; to subscribe again, run "
            + (f"the DAG {initial_sync}" if initial_sync else "its refresh and initial copy"))
    if _slot_exists(resolved, name):
        return  # the apply fails naming what is missing: the slot holds WAL for a state that is not there
    how = f"trigger the DAG {initial_sync}" if initial_sync else "run its refresh and initial copy"
    raise AirflowSkipException(f"subscription {name!r} is not subscribed yet (no state in the subscriber, no slot on "
                               f"the publisher): {how} to subscribe it; until then these runs have nothing to apply")


def _slot_exists(resolved: ResolvedSpec, name: str) -> bool:
    """Whether the subscription's slot exists on the publisher; True when that cannot be told (then the
    apply decides, with its own error)."""
    if not resolved.spec.publisher:
        return True
    try:
        with resolved.connect("publisher") as conn:
            _, slot = read_slot(conn, capture_names(name)[0])
    except (RowFilterError, psycopg.Error):
        return True
    return slot.exists
