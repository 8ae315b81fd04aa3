"""VerifyTablesOperator: each table of a subscription compared with its publisher's rows (``rowfilter verify``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk.exceptions import AirflowException

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.relation import TableName, table_names
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec
from airflow_provider_rowfilter.operators.metrics import check_metrics
from airflow_provider_rowfilter.operators.rowfilter_job import RowFilterJobOperator
from airflow_provider_rowfilter.subscriber.state import StateReader

if TYPE_CHECKING:
    from airflow.sdk import Context


def positive(name: str, value: Any) -> list[str]:
    """``--name value`` for a positive integer argument; nothing for None."""
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{name}={value!r} is not a positive integer", hint=f"pass {name}=8, or leave it out")
    return [f"--{name.replace('_', '-')}", str(value)]


def table_arguments(tables: list[TableName]) -> list[str]:
    return [a for t in tables for a in ("--table", t.as_sql())]


def checks_summary(resolved: ResolvedSpec, tables: list[TableName], kind: str) -> dict[str, Any]:
    """The chosen tables' last check (``rowfilter.table_check``) as the task's XCom: clean or not, and each table's."""
    name = resolved.spec.subscription
    with resolved.connect("subscriber") as conn:
        reader = StateReader(conn, name)
        checks = reader.checks()
        rels = reader.tables(tables or None)
    found = [{**checks[r.table].result, "checked_at": checks[r.table].checked_at.isoformat()}
             for r in rels if r.table in checks and checks[r.table].kind == kind]
    missing = [str(r.table) for r in rels if r.table not in checks or checks[r.table].kind != kind]
    return {"subscription": name, "clean": all(c["clean"] for c in found), "tables": found, "not_checked": missing}


class VerifyTablesOperator(RowFilterJobOperator):
    """Compare each table with its publisher's rows under its effective copy filter and column list (the ``verify`` job).

    Read-only on both sides: both are held at one LSN (the publisher by a snapshot, the subscriber by applying
    exactly to it), every table's rows are hashed per key range in the databases, and rows are read only in
    the ranges that differ (docs/verify.md). The task fails, without retry, when a table differs (set
    ``fail_on_difference=False`` to have the XCom say so instead); a table not copied yet is left out.

    :param tables: the tables to verify, ``schema.table``, a list or a comma-separated string; default all of
        the subscription's tables. (templated)
    :param max_readers: most parallel readers of one side of one table (default 8).
    :param fail_on_difference: fail the task when a table differs (default True).

    The other parameters are those of
    :class:`~airflow_provider_rowfilter.operators.rowfilter_job.RowFilterJobOperator`.

    Returns (XCom) ``{"subscription": "s1", "clean": false, "tables": [{"table": "public.t1", "lsn": "0/1A2B3C",
    "missing": 1, "extra": 0, "different": 2, "examples": {"missing": ["(42)"], …}, "clean": false, …}],
    "not_checked": []}``, read from ``rowfilter.table_check`` after the job; each table's counts also go to the
    metrics (``rowfilter.<subscription>.<schema>.<table>.verify.*``).
    """

    job: ClassVar[str] = "verify"
    kind: ClassVar[str] = "verify"
    template_fields: Sequence[str] = (*RowFilterJobOperator.template_fields, "tables")

    def __init__(self, *, tables: Sequence[str] | str | None = None, max_readers: int | None = None,
                 fail_on_difference: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tables = tables
        self.max_readers = max_readers
        self.fail_on_difference = fail_on_difference

    def job_arguments(self) -> list[str]:
        return [*table_arguments(table_names(self.tables)), *positive("max_readers", self.max_readers),
                *([] if self.fail_on_difference else ["--exit-zero"])]

    def summary(self, resolved: ResolvedSpec, before: Any) -> dict[str, Any]:
        result = checks_summary(resolved, table_names(self.tables), self.kind)
        check_metrics(result)
        for t in result["tables"]:
            self.log.info("%s: %s at %s: %s missing, %s extra, %s different (%s rows compared)", t["table"], self.kind,
                          t["lsn"], t["missing"], t["extra"], t["different"], t["rows"])
        return result

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]  # SparkSubmitOperator's returns None
        try:
            return super().execute(context)
        except AirflowException:
            # A table differs (or the job failed): its counts still reach the metrics.
            resolved = self._best_effort("resolve the spec", self.resolve_spec)
            if resolved is not None:
                self._best_effort("read the checks after the job", self.summary, resolved, None)
            raise
