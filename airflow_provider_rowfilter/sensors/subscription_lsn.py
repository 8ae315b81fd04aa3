"""SubscriptionLsnSensor: read-your-writes, wait until every table of a subscription has applied past a publisher LSN."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias, BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.hooks.subscription_rel import SubscriptionRelHook
from airflow_provider_rowfilter.operators.table_assets import default_asset_alias, table_asset_uri
from airflow_provider_rowfilter.subscriber.applied_position import check_applied
from airflow_provider_rowfilter.triggers.subscription_lsn import SubscriptionLsnTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class SubscriptionLsnSensor(BaseSensorOperator):
    """Wait until every table of a subscription holds what the publisher had committed through ``lsn`` (or at ``at``).

    A table counts once its recorded position is at or past the LSN in state ``r`` (or ``s``, or ``f``: a copy
    consistent with a later snapshot); see subscriber/applied_position.py. Downstream tasks then read the
    subscriber knowing that "the data up to X is in". The sensor fails at once, without retry, when the
    subscription or one of its tables records an error. On success it adds an asset event per table of the
    subscription to its ``AssetAlias`` outlet (``rowfilter_<subscription>``, the one the DAG factory's apply tasks
    use), with ``{"subscription", "table", "lsn", "position"}`` as extra, and returns (XCom)
    ``{"lsn": X, "tables": {"public.t1": "r at 0/…"}}``.

    :param subscription: the subscription's name. (templated)
    :param subscriber_conn_id: the subscriber's Airflow ``postgres`` connection. (templated)
    :param lsn: the publisher LSN, ``X/Y`` (e.g. an upstream task's ``SELECT pg_current_wal_insert_lsn()`` after
        its COMMIT). (templated)
    :param at: instead of ``lsn``, a time (ISO 8601, or a datetime; templated, e.g. ``"{{ data_interval_end }}"``):
        wait for what the publisher had committed then (publisher/wal_position.py: exact for a time not yet past,
        read when the publisher's clock reaches it; for a past time, the position read at the task's start, which
        holds everything committed by then). Needs ``publisher_conn_id``; not with ``mode="reschedule"``.
    :param publisher_conn_id: the publisher's Airflow ``postgres`` connection, for ``at``. (templated)
    :param asset_alias: the ``AssetAlias`` outlet's name; default ``rowfilter_<subscription>``; ``""`` none.
    :param deferrable: wait in the triggerer instead of a worker slot (default False).
    :param poke_interval: seconds between reads (default 60).
    """

    template_fields: Sequence[str] = ("subscription", "subscriber_conn_id", "lsn", "at", "publisher_conn_id")
    ui_color = "#e0f0d8"

    def __init__(self, *, subscription: str, subscriber_conn_id: str, lsn: str | None = None,
                 at: str | datetime | None = None, publisher_conn_id: str | None = None,
                 asset_alias: str | None = None, deferrable: bool = False,
                 poke_interval: timedelta | float = 60, **kwargs: Any) -> None:
        alias = default_asset_alias(subscription) if asset_alias is None else asset_alias
        if alias:
            outlets = list(kwargs.pop("outlets", None) or [])
            if not any(isinstance(o, AssetAlias) and o.name == alias for o in outlets):
                outlets.append(AssetAlias(alias))
            kwargs["outlets"] = outlets
        super().__init__(poke_interval=poke_interval, **kwargs)
        if (lsn is None) == (at is None):
            raise ValueError(f"{self.task_id}: give lsn= (a publisher LSN) or at= (a time), one of them")
        if at is not None and self.mode == "reschedule":
            raise ValueError(f"{self.task_id}: at= is resolved once per try; use the poke mode or deferrable=True")
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.lsn = lsn
        self.at = at
        self.publisher_conn_id = publisher_conn_id
        self.deferrable = deferrable
        self._target: str | None = None

    # --- the position ---------------------------------------------------------------------------------
    def _position(self) -> str:
        """The LSN to wait for, resolved once (``at``: read from the publisher, publisher/wal_position.py)."""
        if self._target is not None:
            return self._target
        try:
            if self.lsn is not None:
                self._target = format_lsn(parse_lsn(str(self.lsn).strip()))
                return self._target
            from airflow_provider_rowfilter.publisher.wal_position import committed_position, parse_at

            if not self.publisher_conn_id:
                raise AirflowFailException(f"{self.task_id}: at= needs publisher_conn_id=")
            at = parse_at(self.at)  # not None: lsn is None
            endpoint = SubscriptionRelHook.endpoint(self.publisher_conn_id, "publisher")
            with endpoint.connect(application_name="rowfilter:sensor") as conn:
                position = committed_position(conn, at, deadline=None)
        except RowFilterError as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        self.log.info("What the publisher had committed at %s: through %s (%s)", position.at, position.lsn,
                      "read when its clock reached it" if position.exact else
                      f"read at {position.read_at}: it holds everything committed by then")
        self._target = position.lsn
        return self._target

    # --- waiting --------------------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        lsn = self._position()
        if self.deferrable:
            done = self.poke(context)
            if done:
                return self._done(context, done.xcom_value)
            self.defer(trigger=SubscriptionLsnTrigger(subscription=self.subscription,
                                                      subscriber_conn_id=self.subscriber_conn_id, lsn=lsn,
                                                      poke_interval=self.poke_interval),
                       method_name="execute_complete", timeout=timedelta(seconds=self.timeout))
        return self._done(context, super().execute(context))

    def poke(self, context: Context) -> PokeReturnValue:
        lsn = self._position()
        try:
            progress = check_applied(SubscriptionRelHook(self.subscriber_conn_id, self.subscription).read_state(), lsn)
        except RowFilterError as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        if progress.error:
            raise AirflowFailException(progress.error)
        if progress.done:
            return PokeReturnValue(True, {"lsn": progress.lsn, "tables": progress.positions})
        self.log.info("Subscription %s: waiting for %s to apply past %s%s", self.subscription,
                      progress.waiting_text(), progress.lsn,
                      " (the subscription is disabled: `rowfilter enable` resumes it)" if progress.disabled else "")
        return PokeReturnValue(False)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the trigger fired: the tables' positions and the asset events, or the trigger's error."""
        if not event:
            raise AirflowException(f"{self.task_id}: the trigger ended without an event")
        if event.get("status") == "success":
            return self._done(context, {"lsn": event.get("lsn"), "tables": event.get("tables", {})})
        message = event.get("message") or "unknown error"
        if event.get("retryable"):
            raise AirflowException(message)
        raise AirflowFailException(message)

    def _done(self, context: Context, value: Any) -> Any:
        """Say it, and add an asset event per table to every ``AssetAlias`` outlet."""
        if not isinstance(value, Mapping):
            return value
        tables: Mapping[str, str] = value.get("tables") or {}
        self.log.info("Subscription %s: every table applied past %s: %s", self.subscription, value.get("lsn"),
                      ", ".join(f"{t} ({p})" for t, p in tables.items()) or "no tables")
        aliases = [o for o in self.outlets if isinstance(o, AssetAlias)]
        events = context.get("outlet_events") if isinstance(context, Mapping) else None
        if aliases and events is not None and tables:
            url = SubscriptionRelHook.endpoint(self.subscriber_conn_id, "subscriber").url
            for table, position in tables.items():
                extra = {"subscription": self.subscription, "table": table, "lsn": value.get("lsn"),
                         "position": position}
                for alias in aliases:
                    events[alias].add(Asset(table_asset_uri(url, table)), extra=extra)
            self.log.info("Asset events on %s: %s", ", ".join(a.name for a in aliases), ", ".join(tables))
        return dict(value)
