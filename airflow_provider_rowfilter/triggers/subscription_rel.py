"""SubscriptionRelTrigger: wait in the triggerer until a subscription's tables reach a sync state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.hooks.subscription_rel import SubscriptionRelHook, parse_state, parse_tables


class SubscriptionRelTrigger(BaseTrigger):
    """Poll ``rowfilter.subscription_rel`` with psycopg's AsyncConnection until the tables are there.

    Fires one event and stops: ``{"status": "success", "states": {table: state}}`` when every
    chosen table reached ``target_state``; ``{"status": "error", "message": …, "retryable": False}``
    when a table or the subscription records an error or a named table is not subscribed (the
    sensor fails without retry); ``{"status": "error", …, "retryable": True}`` when the subscriber
    cannot be read (the sensor fails, and Airflow's retries apply).

    :param subscription: the subscription's name.
    :param subscriber_conn_id: the subscriber's Airflow ``postgres`` connection (looked up in the
        triggerer; no password is stored with the trigger).
    :param tables: ``schema.table`` names, or None for all of the subscription's tables.
    :param target_state: the state letter to wait for (``"r"``, ``"f"``, …).
    :param poke_interval: seconds between reads.
    """

    def __init__(self, *, subscription: str, subscriber_conn_id: str, tables: Sequence[str] | None = None,
                 target_state: str = "r", poke_interval: float = 60.0) -> None:
        super().__init__()
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.tables = list(tables) if tables is not None else None
        self.target_state = target_state
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "subscription": self.subscription,
                "subscriber_conn_id": self.subscriber_conn_id,
                "tables": self.tables,
                "target_state": self.target_state,
                "poke_interval": self.poke_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            tables = parse_tables(self.tables)
            target = parse_state(self.target_state)
        except RowFilterError as e:
            yield TriggerEvent({"status": "error", "message": str(e), "retryable": False})
            return
        hook = SubscriptionRelHook(self.subscriber_conn_id, self.subscription)
        while True:
            try:
                progress = await hook.aprogress(tables, target)
            except RowFilterError as e:
                yield TriggerEvent({"status": "error", "message": str(e), "retryable": False})
                return
            except psycopg.Error as e:
                yield unreadable_state(self.subscription, self.subscriber_conn_id, e)
                return
            if progress.error:
                yield TriggerEvent({"status": "error", "message": progress.error, "retryable": False,
                                    "states": progress.states})
                return
            if progress.done:
                yield TriggerEvent({"status": "success", "states": progress.states})
                return
            self.log.info("Subscription %s: waiting for %s to reach %r", self.subscription,
                          ", ".join(f"{t} ({progress.states[t]})" for t in progress.waiting), target.value)
            await asyncio.sleep(self.poke_interval)


def unreadable_state(subscription: str, conn_id: str, e: psycopg.Error) -> TriggerEvent:
    """The event of a wait that could not read the subscriber's state: retryable (the server may come back)."""
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return TriggerEvent({"status": "error", "retryable": True,
                         "message": f"cannot read the state of subscription {subscription!r} from {conn_id!r}: {message}"})
