"""Read where a subscription's tables stand (``rowfilter.subscription_rel``), blocking or async.

The sensor pokes with :meth:`SubscriptionRelHook.progress`, the trigger polls with
:meth:`SubscriptionRelHook.aprogress`; both read the same rows through the state module's reader
(subscriber/state_reader.py: :class:`StateReader`, :class:`AsyncStateReader`) and judge them with the same
pure function, :func:`check_progress`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_rowfilter.connection import open_async_session
from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.relation import TableName, table_names
from airflow_provider_rowfilter.core.sync_state import SyncState, at_least
from airflow_provider_rowfilter.hooks.rowfilter import RowFilterHook
from airflow_provider_rowfilter.subscriber.state_reader import (
    AsyncStateReader,
    StateReader,
    StateReading,
)


@dataclass(frozen=True)
class Progress:
    """How far the chosen tables are: done, still waiting, or failed for good (``error``)."""

    done: bool
    states: dict[str, str] = field(default_factory=dict)  # chosen table -> state letter
    waiting: tuple[str, ...] = ()
    error: str | None = None


def parse_tables(value: Sequence[str] | str | None) -> list[TableName] | None:
    """``tables`` as given to the sensor (list or comma-separated string) -> names; None for all."""
    return table_names(value) or None


def parse_state(value: str | SyncState) -> SyncState:
    """``target_state`` as a letter (``"r"``), an enum member, or a member name (``"READY"``)."""
    if isinstance(value, SyncState):
        return value
    text = str(value).strip()
    for state in SyncState:
        if text in (state.value, state.name, state.name.lower(), state.label):
            return state
    raise SpecError(f"target_state={value!r} is not a sync state",
                    hint="use one of 'i', 'd', 'f', 's', 'r' (init, data copy, finished copy, synchronized, "
                    "ready)")


def check_progress(reading: StateReading, tables: Iterable[TableName] | None, target: SyncState) -> Progress:
    """Judge a reading of the state: done when every chosen table reached ``target``; failed on a recorded error.

    A recorded error fails at once, as a stopped native subscription shows its error until someone
    acts: retrying the wait cannot fix it. So does a table that is not part of the subscription.
    """
    name = reading.subscription
    if not reading.exists:
        return Progress(False, error=f"subscription {name!r} has no state in the subscriber (no row in "
                        f"rowfilter.subscription); run RefreshPublicationOperator for it first, or check "
                        f"subscription= and subscriber_conn_id=")
    by_table = {r.table: (r.state, r.last_error) for r in reading.tables}
    chosen = sorted(by_table) if tables is None else sorted(set(tables))
    unknown = [str(t) for t in chosen if t not in by_table]
    if unknown:
        return Progress(False, error=f"table(s) {', '.join(unknown)} not part of subscription {name!r} "
                        f"(its tables: {', '.join(str(t) for t in sorted(by_table)) or 'none'}); fix tables= or "
                        f"publish the table and run RefreshPublicationOperator")
    states = {str(t): by_table[t][0].value for t in chosen}
    if reading.last_error:
        return Progress(False, states, error=f"subscription {name!r} stopped with an error: {reading.last_error}")
    failed = [(t, by_table[t][1]) for t in chosen if by_table[t][1]]
    if failed:
        text = "; ".join(f"{t}: {err}" for t, err in failed)
        return Progress(False, states, error=f"subscription {name!r}, table {text}")
    waiting = tuple(str(t) for t in chosen if not at_least(by_table[t][0], target))
    return Progress(not waiting, states, waiting)


class SubscriptionRelHook(RowFilterHook):
    """Read a subscription's per-table sync state from the subscriber (an Airflow ``postgres`` connection).

    :param subscriber_conn_id: the subscriber's Airflow ``postgres`` connection.
    :param subscription: the subscription's name.
    """

    def __init__(self, subscriber_conn_id: str, subscription: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.subscriber_conn_id = subscriber_conn_id
        self.subscription = subscription

    def read_state(self) -> StateReading:
        with self.endpoint(self.subscriber_conn_id, "subscriber").connect(application_name="rowfilter:sensor") as conn:
            return StateReader(conn, self.subscription).read_state()

    async def aread_state(self) -> StateReading:
        endpoint = await self.aendpoint(self.subscriber_conn_id, "subscriber")
        async with await open_async_session(endpoint.url, application_name="rowfilter:trigger",
                                            **endpoint.connect_kwargs()) as conn:
            return await AsyncStateReader(conn, self.subscription).read_state()

    def progress(self, tables: Iterable[TableName] | None, target: SyncState) -> Progress:
        return check_progress(self.read_state(), tables, target)

    async def aprogress(self, tables: Iterable[TableName] | None, target: SyncState) -> Progress:
        return check_progress(await self.aread_state(), tables, target)

