"""SlotGuardOperator: read the slot into the change log while the apply is paused or disabled (flows/slot_guard.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from airflow_provider_rowfilter.connection import one
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec
from airflow_provider_rowfilter.operators.apply_dag import apply_dag
from airflow_provider_rowfilter.operators.subscription_ops import SubscriptionOperator, connection_passwords, with_store
from airflow_provider_rowfilter.operators.task_errors import clear_errors, in_airflow_terms

if TYPE_CHECKING:
    from airflow.sdk import Context


class SlotGuardOperator(SubscriptionOperator):
    """Keep the subscription's slot read while nothing applies it: one capture run into the change log.

    Runs when the incremental sync (``apply_dag_id``) is paused, when the subscription is disabled
    (``rowfilter disable``), or when the slot is near an invalidation with no session reading it
    (core/slot_retention.py ``exposures``: half of ``idle_replication_slot_timeout`` idle, or half of
    ``max_slot_wal_keep_size`` used); otherwise it is skipped, saying why. It captures, in the task's own
    process and under the apply's lock, every transaction the publisher had committed when it started
    (within ``time_budget``), applying nothing: the next apply applies them exactly once, and no table is
    copied again. An apply that runs meanwhile reads the slot itself; the guard then does nothing.

    :param apply_dag_id: the incremental-sync DAG whose pause it watches (the DAG factory's
        ``<prefix>_incremental_sync``); None: only a disabled subscription or a slot at risk. (templated)
    :param time_budget: seconds after which it starts no further capture (default 240).

    Returns (XCom) ``{"subscription", "why", "captures", "changes", "transactions", "segments", "start_lsn",
    "end_lsn", "caught_up"}``.
    """

    template_fields: Sequence[str] = (*SubscriptionOperator.template_fields, "apply_dag_id")
    roles = ("publisher", "subscriber")
    ui_color = "#d6e4f0"

    def __init__(self, *, apply_dag_id: str | None = None, time_budget: float | None = 240.0,
                 change_log_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.apply_dag_id = apply_dag_id
        self.time_budget = time_budget
        self.change_log_conn_id = change_log_conn_id

    def resolve(self) -> ResolvedSpec:
        return with_store(super().resolve(), self.change_log_conn_id, self.task_id)

    @clear_errors
    def execute(self, context: Context) -> dict[str, Any]:
        # Imported here: a DAG file that declares the operator loads none of the capture's code (nor pyarrow).
        from airflow_provider_rowfilter.connection import is_transient
        from airflow_provider_rowfilter.core.spec.environment import environment
        from airflow_provider_rowfilter.flows.slot_guard import guard_slot

        resolved = self.resolve()
        name = resolved.spec.subscription
        try:
            with connection_passwords(resolved):
                why = self._why(resolved, context)
            if why is None:
                raise AirflowSkipException(f"subscription {name!r}: its apply reads the slot (its DAG is not paused, "
                                           "the subscription is enabled, the slot is not near an invalidation): "
                                           "nothing to guard")
            self.log.info("Subscription %s: %s: reading its slot into the change log, applying nothing", name, why)
            with connection_passwords(resolved), environment(resolved.store_env):
                result = guard_slot(resolved.spec, time_budget=self.time_budget)
        except (RowFilterError, psycopg.Error) as e:
            text = in_airflow_terms(self, str(e).strip())
            raise (AirflowException if is_transient(e) else AirflowFailException)(
                f"{self.task_id}: the slot guard of {name!r} could not read the slot: {text}") from None
        if result.skipped:
            raise AirflowSkipException(f"subscription {name!r}: {result.describe()}")
        self.log.info("Subscription %s: %s", name, result.describe())
        return {**result.summary(), "why": why}

    def _why(self, resolved: ResolvedSpec, context: Context) -> str | None:
        """Why the slot needs the guard now (None: the apply reads it)."""
        from airflow_provider_rowfilter.core.slot_retention import exposures
        from airflow_provider_rowfilter.publisher.slot_health import read_retention, read_slot
        from airflow_provider_rowfilter.subscriber.state_reader import StateReader

        dag = apply_dag(context, self.apply_dag_id)
        if dag is not None and dag.paused:
            return f"its incremental sync {dag.dag_id} is paused"
        with resolved.connect("subscriber") as conn:
            row = StateReader(conn, resolved.spec.subscription).subscription_row()
        if row is None:
            raise AirflowSkipException(f"subscription {resolved.spec.subscription!r} has no state in the subscriber "
                                       "(not subscribed yet, or dropped): no slot to guard")
        if not row.enabled:
            return "it is disabled (`rowfilter disable`)"
        with resolved.connect("publisher") as conn:
            _, slot = read_slot(conn, row.slot_name)
            retention = read_retention(conn)
            now = one(conn.execute("SELECT clock_timestamp()"))[0]
        if not slot.exists or slot.lost or slot.active:
            return None  # nothing to read (the check says why), or a session reads it now
        risky = [e for e in exposures(retention, active=slot.active, inactive_since=slot.inactive_since,
                                      wal_status=slot.wal_status, safe_wal_size=slot.safe_wal_size,
                                      now=now) if e.at_risk]
        return f"its slot would be {risky[0].describe()}" if risky else None
