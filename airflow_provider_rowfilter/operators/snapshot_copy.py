"""SnapshotCopyOperator: table synchronization of a subscription's tables (PostgreSQL's tablesync worker)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.relation import TableName, table_names
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec
from airflow_provider_rowfilter.operators.rowfilter_job import RowFilterJobOperator
from airflow_provider_rowfilter.subscriber.state import StateStore


class SnapshotCopyOperator(RowFilterJobOperator):
    """Copy the rows each table's publications select into the subscriber (the ``snapshot`` job).

    For every chosen table in state ``i`` (or ``d``, an interrupted copy): state ``d``, copy the
    rows that satisfy any of the subscription's publications' filters, only the published columns,
    in parallel Spark partitions; record the position from which changes are replayed; state ``f``.

    :param tables: the tables to copy, ``schema.table`` (``public`` when no schema is given), as a
        list or a comma-separated string; default all of the subscription's tables. (templated)
    :param resync: first empty the named ``tables`` in the subscriber and send them back to ``i``,
        then copy them: the backfill path (``--resync``; needs ``tables``).
    :param max_partitions: most parallel copies per table (default: one, straight into the table, unless the
        planner says several pay, for a large table whose filter keeps little of it; then up to twice
        Spark's parallelism).
    :param fetch_size: rows handed from the publisher's ``COPY`` to the subscriber's per write.
    :param confirm_empty: with ``resync``, the confirmation that the tables may be emptied (the DAG factory's resync
        DAG asks for it: ``true``; anything else refuses, emptying nothing, and names the reconcile that repairs in
        place instead). None (default): no confirmation asked. (templated)

    The other parameters are those of
    :class:`~airflow_provider_rowfilter.operators.rowfilter_job.RowFilterJobOperator`.

    Returns (XCom) ``{"subscription": "s1", "rows_copied": 42, "tables": [{"table": "public.t1",
    "state": "f", "lsn": "0/1A2B3C", "rows_copied": 40}, …]}``, read from
    ``rowfilter.subscription_rel`` after the job, for the chosen tables.
    """

    job: ClassVar[str] = "snapshot"
    template_fields: Sequence[str] = (*RowFilterJobOperator.template_fields, "tables", "confirm_empty")

    def __init__(self, *, tables: Sequence[str] | str | None = None, resync: bool = False,
                 max_partitions: int | None = None, fetch_size: int | None = None,
                 confirm_empty: bool | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tables = tables
        self.resync = resync
        self.confirm_empty = confirm_empty
        self.max_partitions = max_partitions
        self.fetch_size = fetch_size

    def chosen_tables(self) -> list[TableName]:
        """The rendered ``tables`` as names; empty for all of the subscription's tables."""
        return table_names(self.tables)

    def job_arguments(self) -> list[str]:
        tables = self.chosen_tables()
        arguments: list[str] = []
        for table in tables:
            arguments += ["--table", table.as_sql()]
        if self.resync:
            if not tables:
                raise SpecError("resync=True needs the tables to copy again",
                                hint="pass tables=['public.t1'] (a resync empties those tables first)")
            if self.confirm_empty is not None and str(self.confirm_empty).strip().lower() not in ("true", "1", "yes"):
                listed = ", ".join(str(t) for t in tables)
                raise SpecError(f"a resync empties {listed} in the subscriber before copying it again, and "
                                "confirm_empty is not true: nothing was emptied",
                                hint=f"trigger again with confirm_empty = true to empty and copy {listed}; or repair "
                                "in place, the table staying readable, with `rowfilter reconcile "
                                + " ".join(f"--table {t}" for t in tables) + "`")
            arguments.append("--resync")
        for name, value in (("max_partitions", self.max_partitions), ("fetch_size", self.fetch_size)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"{name}={value!r} is not a positive integer", hint=f"pass {name}=8, or leave it out")
            arguments += [f"--{name.replace('_', '-')}", str(value)]
        return arguments

    def summary(self, resolved: ResolvedSpec, before: Any) -> dict[str, Any]:
        name = resolved.spec.subscription
        chosen = self.chosen_tables() or None
        with resolved.connect("subscriber") as conn:
            tables = StateStore(conn, name).tables(chosen)
        rows = [{"table": str(t.table), "state": t.state.value, "lsn": t.lsn, "rows_copied": t.rows_copied}
                for t in tables]
        for t in rows:
            self.log.info("%s: state %s, %s row(s) copied, lsn %s", t["table"], t["state"], t["rows_copied"],
                          t["lsn"])
        return {"subscription": name, "rows_copied": sum(t["rows_copied"] or 0 for t in rows), "tables": rows}
