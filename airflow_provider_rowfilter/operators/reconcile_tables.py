"""ReconcileTablesOperator: tables repaired in place to what a new copy would hold (``rowfilter reconcile``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from airflow_provider_rowfilter.core.relation import table_names
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec
from airflow_provider_rowfilter.operators.metrics import check_metrics
from airflow_provider_rowfilter.operators.rowfilter_job import RowFilterJobOperator
from airflow_provider_rowfilter.operators.verify_tables import checks_summary, positive, table_arguments


class ReconcileTablesOperator(RowFilterJobOperator):
    """Bring each table to exactly what a new initial copy under the current definitions would hold (the
    ``reconcile`` job): missing rows inserted, extra ones deleted, different ones updated, one key range per
    transaction; the table is never emptied (docs/verify.md).

    The alternative to emptying and copying again after a filter or column-list change, a lost slot or for a
    backfill. While a table is reconciled it is held in state ``d`` (readable, not applied to); the apply
    catches it up afterwards. Killed, the task's retry finishes it.

    :param tables: the tables to reconcile, ``schema.table``, a list or a comma-separated string; default all of
        the subscription's tables. (templated)
    :param dry_run: change nothing: verify and return what would change. (templated)
    :param max_readers: most parallel readers of one side of one table (default 8).

    The other parameters are those of
    :class:`~airflow_provider_rowfilter.operators.rowfilter_job.RowFilterJobOperator`.

    Returns (XCom) ``{"subscription": "s1", "clean": true, "tables": [{"table": "public.t1", "lsn": "0/1A2B3C",
    "inserted": 12, "updated": 3, "deleted": 40, …}], "not_checked": []}`` (with ``dry_run``: the verify's).
    """

    job: ClassVar[str] = "reconcile"
    template_fields: Sequence[str] = (*RowFilterJobOperator.template_fields, "tables", "dry_run")

    def __init__(self, *, tables: Sequence[str] | str | None = None, dry_run: bool = False,
                 max_readers: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tables = tables
        self.dry_run = dry_run  # type: ignore[method-assign,assignment]  # the parameter; shadows BaseOperator.dry_run()
        self.max_readers = max_readers

    @property
    def dry(self) -> bool:
        """``dry_run`` rendered (a DAG's parameter renders as text unless rendered as a native object)."""
        return self.dry_run if isinstance(self.dry_run, bool) else str(self.dry_run).strip().lower() == "true"

    def job_arguments(self) -> list[str]:
        return [*table_arguments(table_names(self.tables)), *positive("max_readers", self.max_readers),
                *(["--dry-run"] if self.dry else [])]

    def summary(self, resolved: ResolvedSpec, before: Any) -> dict[str, Any]:
        if self.dry:  # nothing is recorded by a dry run: what the job printed
            printed = self._output.result if self._output is not None and self._output.result else {}
            return {"subscription": resolved.spec.subscription, "dry_run": True, "tables": printed.get("tables", [])}
        result = checks_summary(resolved, table_names(self.tables), "reconcile")
        check_metrics(result)
        for t in result["tables"]:
            self.log.info("%s: reconciled at %s: inserted %s, updated %s, deleted %s", t["table"], t["lsn"],
                          t["inserted"], t["updated"], t["deleted"])
        return result
