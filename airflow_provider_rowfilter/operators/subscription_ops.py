"""The operations of a subscription as Airflow tasks: skip a remote transaction, sync sequences, drop the subscription.

What ``rowfilter skip`` and ``rowfilter drop`` do, with Airflow connections instead of URLs, so that
nobody writes a second spec at 3 a.m.; the DAG factory makes a parameterised DAG of each (and one
that resyncs tables with :class:`~airflow_provider_rowfilter.operators.snapshot_copy.SnapshotCopyOperator`).
Neither needs Spark: they run in the task's own process.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import psycopg
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_rowfilter.connection import in_task
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec, RowFilterHook
from airflow_provider_rowfilter.operators.task_errors import clear_errors, factory_prefix

if TYPE_CHECKING:
    from airflow.sdk import Context


class SubscriptionOperator(BaseOperator):
    """A task on one subscription, given by a spec file and/or its fields (as the job operators take them)."""

    template_fields: Sequence[str] = ("spec", "subscription", "publisher_conn_id", "subscriber_conn_id")
    roles: tuple[str, ...] = ("subscriber",)

    def __init__(self, *, spec: str | None = None, subscription: str | None = None,
                 publisher_conn_id: str | None = None, subscriber_conn_id: str | None = None,
                 change_log: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.subscription = subscription
        self.publisher_conn_id = publisher_conn_id
        self.subscriber_conn_id = subscriber_conn_id
        self.change_log = change_log

    def resolve(self) -> ResolvedSpec:
        fields = {"subscription": self.subscription, "publisher_conn_id": self.publisher_conn_id,
                  "subscriber_conn_id": self.subscriber_conn_id, "change_log": self.change_log}
        base_dir = self.dag.folder if self.has_dag() else None
        try:
            return RowFilterHook().resolve_spec(spec=self.spec, fields=fields, base_dir=base_dir, require=self.roles)
        except RowFilterError as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e


def with_store(resolved: ResolvedSpec, change_log_conn_id: str | None, task_id: str) -> ResolvedSpec:
    """The spec with its change log's store credentials (``change_log_conn_id``, else the spec's), resolved from the
    Airflow connection as the job operators resolve them (hooks/store_connection.py), for a run in this task."""
    from dataclasses import replace

    from airflow_provider_rowfilter.hooks.store_connection import store_environment

    store = change_log_conn_id or resolved.spec.change_log_conn_id
    try:
        return replace(resolved, store_env=store_environment(store)) if store else resolved
    except RowFilterError as e:
        raise AirflowFailException(f"{task_id}: {e}") from e


def connection_passwords(resolved: ResolvedSpec) -> AbstractContextManager[None]:
    """The connections' passwords handed to the job's code in this process only (connection.py ``in_task``),
    never into the task's environment, which its child processes would inherit."""
    return in_task({role: e.password for role, e in resolved.endpoints.items() if e.password})


class SkipTransactionOperator(SubscriptionOperator):
    """``ALTER SUBSCRIPTION … SKIP (lsn = …)`` (``rowfilter skip``): the next apply drops the remote
    transaction that finished at ``lsn`` (the LSN a conflict error names); ``"NONE"`` clears it.

    :param lsn: the finish LSN of the transaction to skip, or ``NONE``. (templated)

    Fails without retry for an LSN that is not past the subscription's applied position (PostgreSQL's
    rule and message). Returns (XCom) ``{"subscription", "skip_lsn"}``.
    """

    template_fields: Sequence[str] = (*SubscriptionOperator.template_fields, "lsn")

    def __init__(self, *, lsn: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lsn = lsn

    @clear_errors
    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_rowfilter.subscriber.state import StateStore

        resolved = self.resolve()
        try:
            with resolved.connect("subscriber") as conn:
                value = StateStore(conn, resolved.spec.subscription).skip_transaction(str(self.lsn))
        except (RowFilterError, ValueError) as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        self.log.info("Subscription %s: %s", resolved.spec.subscription,
                      f"the remote transaction finished at {value} will be skipped by the next apply" if value
                      else "skip-LSN cleared")
        return {"subscription": resolved.spec.subscription, "skip_lsn": value}


class SetEnabledOperator(SubscriptionOperator):
    """``ALTER SUBSCRIPTION … DISABLE`` / ``ENABLE`` (``rowfilter disable`` / ``enable``): pause the apply, or resume it.

    Disabled, every apply of the subscription (the incremental sync's runs too) applies nothing and says so; the
    watch DAG's slot guard keeps the slot read into the change log meanwhile, so a pause never costs the slot.

    :param enabled: True resumes (enable), False pauses (disable). (templated: ``true``/``false`` as text)

    Returns (XCom) ``{"subscription", "enabled", "was_enabled"}``.
    """

    template_fields: Sequence[str] = (*SubscriptionOperator.template_fields, "enabled")

    def __init__(self, *, enabled: bool | str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.enabled = enabled

    @clear_errors
    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_rowfilter.subscriber.state import StateStore

        resolved = self.resolve()
        enabled = _boolean(self.enabled, f"{self.task_id}: enabled")
        name = resolved.spec.subscription
        try:
            with resolved.connect("subscriber") as conn:
                was = StateStore(conn, name).set_enabled(enabled)
        except (RowFilterError, psycopg.Error) as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        prefix = factory_prefix(self)
        if was == enabled:
            self.log.info("Subscription %s: already %s", name, "enabled" if enabled else "disabled")
        elif enabled:
            self.log.info("Subscription %s: enabled; the next apply goes on from where it stopped", name)
        else:
            self.log.info("Subscription %s: disabled; the apply applies nothing until it is enabled again (%s); the "
                          "watch's slot guard keeps the slot read meanwhile", name,
                          f"the DAG {prefix}_enable_subscription" if prefix else "`rowfilter enable`")
        return {"subscription": name, "enabled": enabled, "was_enabled": was}


class DropSubscriptionOperator(SubscriptionOperator):
    """``DROP SUBSCRIPTION`` (``rowfilter drop``): the slot and our publications on the publisher, the
    subscription's state in the subscriber, the change log moved aside; the subscriber's tables stay.

    :param confirm: must be the subscription's name, so that a run started by mistake drops nothing.
        (templated)
    :param keep_slot: leave the publisher alone (``SET (slot_name = NONE)`` first); its slot keeps WAL.
        (templated: ``true``/``false`` as rendered text are read as such)
    :param change_log_conn_id: the Airflow connection whose credentials reach a change log on object storage
        (default: the spec's ``change_log_conn_id``); the drop moves the log aside last, and checks it can first.

    Refuses, dropping nothing, while an apply, snapshot or resync of the subscription runs, when the change log
    cannot be listed, or when the role may not drop the subscription's replication origins. Returns (XCom) what
    was dropped (flows/drop.py ``DropResult``).
    """

    template_fields: Sequence[str] = (*SubscriptionOperator.template_fields, "confirm", "keep_slot",
                                      "change_log_conn_id")
    roles = ("publisher", "subscriber")

    def __init__(self, *, confirm: str, keep_slot: bool | str = False, change_log_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.confirm = confirm
        self.keep_slot = keep_slot
        self.change_log_conn_id = change_log_conn_id

    @clear_errors
    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_rowfilter.core.spec.environment import environment
        from airflow_provider_rowfilter.flows.drop import drop

        resolved = with_store(self.resolve(), self.change_log_conn_id, self.task_id)
        name = resolved.spec.subscription
        if str(self.confirm).strip() != name:
            raise AirflowFailException(f"{self.task_id}: confirm={self.confirm!r} is not the subscription's name; "
                                       f"nothing was dropped (pass confirm={name!r} to drop subscription {name!r})")
        keep_slot = _boolean(self.keep_slot, f"{self.task_id}: keep_slot")
        try:
            with connection_passwords(resolved), environment(resolved.store_env):
                result = drop(resolved.spec, keep_slot=keep_slot)
        except (RowFilterError, psycopg.Error) as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        self.log.info("Subscription %s: %s", name, result.describe())
        prefix = factory_prefix(self)
        if result.dropped:
            # A task cannot pause a DAG in Airflow 3 (the Execution API has no such call): the scheduled apply
            # skips its runs from now on, saying the subscription was dropped (operators/subscription_guard.py).
            self.log.info("From now on the runs of %s skip, saying the subscription was dropped. Remove its spec "
                          "file%s to remove its DAGs (or pause them); to subscribe again, trigger %s",
                          f"the DAG {prefix}_incremental_sync" if prefix else "its incremental sync",
                          f" ({self.spec})" if self.spec else "",
                          f"the DAG {prefix}_initial_sync" if prefix else "its refresh and initial copy")
        return asdict(result)


class SyncSequencesOperator(SubscriptionOperator):
    """Move the subscriber's sequences past the publisher's (``rowfilter sync-sequences``): before a switchover or
    a failover to the subscriber, since logical replication does not replicate sequences.

    :param tables: the tables whose owned sequences are moved (``schema.table`` names, a list or a comma-separated
        string); None: every table of the subscription. (templated)
    :param dry_run: say what would be set, set nothing. (templated: ``true``/``false`` as rendered text)

    Idempotent: a sequence already past is left alone. Returns (XCom) each sequence with its values before and
    after and what was done (flows/sync_sequences.py ``SequencesResult``).
    """

    template_fields: Sequence[str] = (*SubscriptionOperator.template_fields, "tables", "dry_run")
    roles = ("publisher", "subscriber")

    def __init__(self, *, tables: Sequence[str] | str | None = None, dry_run: bool | str = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tables = tables
        self.dry_run = dry_run  # type: ignore[method-assign,assignment]  # the parameter; shadows BaseOperator.dry_run()

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_rowfilter.core.relation import TableName
        from airflow_provider_rowfilter.flows.sync_sequences import sync_sequences

        resolved = self.resolve()
        dry_run = _boolean(self.dry_run, f"{self.task_id}: dry_run")
        names = self.tables.split(",") if isinstance(self.tables, str) else list(self.tables or [])
        try:
            tables = [TableName.from_sql(t.strip(), "tables") for t in names if t.strip()] or None
            with connection_passwords(resolved):
                result = sync_sequences(resolved.spec, tables, dry_run=dry_run)
        except (RowFilterError, psycopg.Error) as e:
            raise AirflowFailException(f"{self.task_id}: {e}") from e
        for s in result.sequences:
            self.log.info("%s.%s: %s %s (publisher's %s at %s)", s.table, s.column, s.subscriber_sequence or "-",
                          s.action, s.publisher_sequence, s.publisher_last_value)
        if not result.ok:  # the others were synchronized; this task fails, naming each with its fix
            raise AirflowFailException(f"{self.task_id}: {result.error()}")
        return result.summary()


def _boolean(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise AirflowFailException(f"{what}={value!r} is not true or false")
