"""SubscriptionRelSensor: wait until a subscription's tables reach a sync state (``pg_subscription_rel``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.hooks.subscription_rel import SubscriptionRelHook, parse_state, parse_tables
from airflow_provider_rowfilter.triggers.subscription_rel import SubscriptionRelTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class SubscriptionRelSensor(BaseSensorOperator):
    """Wait until every chosen table of a subscription has reached ``target_state`` (or a later one).

    States go i → d → f → s → r, so waiting for ``f`` is satisfied by ``s`` and ``r`` too. The sensor
    fails at once, without retry, when a chosen table (or the subscription) records an error, when a
    named table is not part of the subscription, or when the subscription has no state at all. A table
    refused under ``on_invalid_table: skip`` records why (``refused by refresh …``): waiting for it
    fails with that reason; pass ``tables`` to wait for the others.
    Works in ``poke`` and ``reschedule`` modes, and deferred to the triggerer with
    ``deferrable=True``. Returns (XCom) the chosen tables' states, ``{"public.t1": "r", …}``.

    :param subscription: the subscription's name. (templated)
    :param subscriber_conn_id: the subscriber's Airflow ``postgres`` connection. (templated)
    :param tables: ``schema.table`` names (list or comma-separated string); default all of the
        subscription's tables. (templated)
    :param target_state: the state to wait for: ``"r"`` ready (default), ``"s"``, ``"f"``, … (templated)
    :param deferrable: wait in the triggerer instead of a worker slot (default False).
    :param poke_interval: seconds between reads (default 60).
    """

    template_fields: Sequence[str] = ("subscription", "subscriber_conn_id", "tables", "target_state")
    ui_color = "#e0f0d8"

    def __init__(
        self,
        *,
        subscription: str,
        subscriber_conn_id: str,
        tables: Sequence[str] | str | None = None,
        target_state: str | SyncState = "r",
        deferrable: bool = False,
        poke_interval: timedelta | float = 60,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.tables = tables
        self.target_state = target_state
        self.deferrable = deferrable

    def _settings(self) -> tuple[list[TableName] | None, SyncState]:
        try:
            return parse_tables(self.tables), parse_state(self.target_state)
        except RowFilterError as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        done = self.poke(context)
        if done:
            return done.xcom_value
        tables, target = self._settings()
        self.defer(
            trigger=SubscriptionRelTrigger(
                subscription=self.subscription,
                subscriber_conn_id=self.subscriber_conn_id,
                tables=[str(t) for t in tables] if tables is not None else None,
                target_state=target.value,
                poke_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def poke(self, context: Context) -> PokeReturnValue:
        tables, target = self._settings()
        try:
            progress = SubscriptionRelHook(self.subscriber_conn_id, self.subscription).progress(tables, target)
        except RowFilterError as e:  # a connection id that does not exist or is not postgres
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        if progress.error:
            raise AirflowFailException(progress.error)
        if progress.done:
            self.log.info("Subscription %s: %s reached %r", self.subscription,
                          ", ".join(f"{t} ({s})" for t, s in progress.states.items()) or "no tables", target.value)
            return PokeReturnValue(True, progress.states)
        self.log.info("Subscription %s: waiting for %s to reach %r", self.subscription,
                      ", ".join(f"{t} ({progress.states[t]})" for t in progress.waiting), target.value)
        return PokeReturnValue(False)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, str]:
        """Resume after the trigger fired: return the states, or fail with the trigger's message."""
        if not event:
            raise AirflowException(f"{self.task_id}: the trigger ended without an event")
        if event.get("status") == "success":
            self.log.info("Subscription %s: tables reached %r: %s", self.subscription, self.target_state,
                          event.get("states"))
            return event.get("states", {})
        message = event.get("message") or "unknown error"
        if event.get("retryable"):
            raise AirflowException(message)
        raise AirflowFailException(message)
