"""RefreshPublicationOperator: ``ALTER SUBSCRIPTION … REFRESH PUBLICATION`` as an Airflow task."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec
from airflow_provider_rowfilter.operators.rowfilter_job import RowFilterJobOperator
from airflow_provider_rowfilter.operators.task_errors import in_airflow_terms
from airflow_provider_rowfilter.subscriber.state import StateReader


class RefreshPublicationOperator(RowFilterJobOperator):
    """Reconcile a subscription's tables with its publications (the ``refresh`` job).

    Validates the publication definitions (nothing changes when they are invalid), maintains the
    slot and capture publications on the publisher, and in the subscriber gives each newly published
    table state ``i`` (``r`` with ``copy_data=False``) and removes tables no longer published.
    Running it twice changes nothing the second time.

    :param recreate_slot: the subscription's slot was dropped on the publisher (a gap: the changes
        made meanwhile were never captured): empty every table that had a position, send it back to
        ``i`` for a new copy, and create a new slot. Without it such a refresh fails, changing nothing.
    :param reconcile: repair in place instead (``--reconcile``, docs/verify.md): with ``recreate_slot``, keep
        those tables and reconcile them against the new slot; and reconcile every table whose initial-copy
        filter or column list changed. None: the spec's ``reconcile``.

    Both are templated (a DAG's parameters: ``true``/``false`` as rendered text are read as such), so the DAG
    factory's refresh DAG takes them from its Trigger DAG form: ``recreate_slot`` and ``reconcile`` together are
    ``rowfilter refresh --recreate-slot --reconcile``, the repair the lost slot's error prescribes.

    Takes the parameters of :class:`~airflow_provider_rowfilter.operators.rowfilter_job.RowFilterJobOperator`.

    Returns (XCom) ``{"subscription": "s1", "added": ["public.t1"], "removed": [], "lsn": "0/1A2B3C"
    | None, "tables": [{"table": "public.t1", "state": "i", "lsn": None}, …]}``: what this run
    added and removed (read from ``rowfilter.refresh_history``), and every table's state afterwards.
    """

    job: ClassVar[str] = "refresh"
    archives_classes: ClassVar[bool] = False  # starts a Spark session only to resync a table
    template_fields: Sequence[str] = (*RowFilterJobOperator.template_fields, "recreate_slot", "reconcile")

    def __init__(self, *, recreate_slot: bool | str = False, reconcile: bool | str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recreate_slot = recreate_slot
        self.reconcile = reconcile

    def job_arguments(self) -> list[str]:
        return ((["--recreate-slot"] if flag(self.recreate_slot, "recreate_slot") else [])
                + (["--reconcile"] if flag(self.reconcile, "reconcile") else []))

    def before_submit(self, resolved: ResolvedSpec) -> int:
        with resolved.connect("subscriber") as conn:
            return StateReader(conn, resolved.spec.subscription).last_refresh_id()

    def summary(self, resolved: ResolvedSpec, before: Any) -> dict[str, Any]:
        name = resolved.spec.subscription
        with resolved.connect("subscriber") as conn:
            reader = StateReader(conn, name)
            history = reader.refreshes(after_id=before or 0)
            tables = reader.tables()
        added: list[str] = []
        removed: list[str] = []
        for h in history:
            added = [t for t in added if t not in h.removed] + [t for t in h.added if t not in added]
            removed = [t for t in removed if t not in h.added] + [t for t in h.removed if t not in removed]
        result = {
            "subscription": name,
            "added": sorted(added),
            "removed": sorted(removed),
            "lsn": history[-1].lsn if history else None,
            "tables": [{"table": str(t.table), "state": t.state.value, "lsn": t.lsn} for t in tables],
        }
        self.log.info("Refresh of %s: added %s, removed %s; %d table(s) subscribed", name,
                      result["added"] or "none", result["removed"] or "none", len(tables))
        printed = self._output.result if self._output is not None and self._output.result else {}
        reconciled = {t.get("table") for t in printed.get("reconciled") or []}
        for table, change in sorted((printed.get("copy_definitions_changed") or {}).items()):
            if table not in reconciled:  # the job's WARNING names the command; here, what to trigger instead
                self.log.warning("%s: %s. %s", table, change, in_airflow_terms(
                    self, f"`rowfilter reconcile --table {table}` brings it to what a new copy would hold, in place"))
        return result


def flag(value: Any, name: str) -> bool:
    """A boolean parameter as given, or rendered from a DAG's parameter (``True``, ``false``, ``""``, None)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "", "none"):
        return False
    raise SpecError(f"{name}={value!r} is not true or false", hint=f"pass {name}=True or {name}=False")
