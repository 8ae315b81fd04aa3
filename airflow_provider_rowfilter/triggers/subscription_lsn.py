"""SubscriptionLsnTrigger: wait in the triggerer until every table of a subscription has applied past an LSN."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.hooks.subscription_rel import SubscriptionRelHook
from airflow_provider_rowfilter.subscriber.applied_position import check_applied
from airflow_provider_rowfilter.triggers.subscription_rel import unreadable_state


class SubscriptionLsnTrigger(BaseTrigger):
    """Poll ``rowfilter.subscription_rel`` (psycopg's AsyncConnection) until every table holds the publisher's
    changes through ``lsn`` (subscriber/applied_position.py).

    Fires one event and stops: ``{"status": "success", "lsn": …, "tables": {table: "r at 0/…"}}``;
    ``{"status": "error", "message": …, "retryable": False}`` when the subscription or a table records an error
    (waiting cannot fix it); ``{"status": "error", …, "retryable": True}`` when the subscriber cannot be read.

    :param subscription: the subscription's name.
    :param subscriber_conn_id: the subscriber's Airflow ``postgres`` connection (looked up in the triggerer).
    :param lsn: the publisher LSN, ``X/Y``.
    :param poke_interval: seconds between reads.
    """

    def __init__(self, *, subscription: str, subscriber_conn_id: str, lsn: str, poke_interval: float = 60.0) -> None:
        super().__init__()
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.lsn = lsn
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"subscription": self.subscription, "subscriber_conn_id": self.subscriber_conn_id, "lsn": self.lsn,
                 "poke_interval": self.poke_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = SubscriptionRelHook(self.subscriber_conn_id, self.subscription)
        while True:
            try:
                progress = check_applied(await hook.aread_state(), self.lsn)
            except RowFilterError as e:
                yield TriggerEvent({"status": "error", "message": str(e), "retryable": False})
                return
            except psycopg.Error as e:
                yield unreadable_state(self.subscription, self.subscriber_conn_id, e)
                return
            if progress.error:
                yield TriggerEvent({"status": "error", "message": progress.error, "retryable": False})
                return
            if progress.done:
                yield TriggerEvent({"status": "success", "lsn": progress.lsn, "tables": progress.positions})
                return
            self.log.info("Subscription %s: waiting for %s to apply past %s%s", self.subscription,
                          progress.waiting_text(), progress.lsn,
                          " (the subscription is disabled: `rowfilter enable` resumes it)" if progress.disabled else "")
            await asyncio.sleep(self.poke_interval)
