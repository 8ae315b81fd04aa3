"""What a refresh tells about a table whose initial-copy filter or column list changed since the last refresh.

PostgreSQL's ``ALTER SUBSCRIPTION … REFRESH PUBLICATION`` copies only tables new to the subscription
(``AlterSubscription_refresh`` in src/backend/commands/subscriptioncmds.c): a table already subscribed keeps
the rows it has when its publications' filters or column lists change, or when a publication is added to or
dropped from the subscription. The new definitions apply to changes from then on (docs/verify.md, "What
PostgreSQL does").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_rowfilter.core.relation import TableName

#: What PostgreSQL leaves, said once per table a refresh names.
AS_POSTGRESQL_LEAVES_IT = (
    "as PostgreSQL's REFRESH PUBLICATION, the rows already copied stay as they are: rows that only the old "
    "definition selected stay (their changes no longer arrive), rows that only the new one selects are missing "
    "(an UPDATE of one finds no row here and is skipped), and a column newly published is empty in the rows "
    "copied before")


def _entries(document: Mapping[str, Any] | None) -> dict[TableName, tuple[str | None, tuple[str, ...] | None]]:
    if not document:
        return {}
    return {TableName.parse(t["table"]): (t.get("copy_filter"), None if t.get("columns") is None else tuple(t["columns"]))
            for t in document.get("tables", ())}


def _columns(columns: tuple[str, ...] | None) -> str:
    return "all columns" if columns is None else f"({', '.join(columns)})"


def copy_definition_changes(before: Mapping[str, Any] | None, after: Mapping[str, Any],
                            tables: Iterable[TableName]) -> dict[TableName, str]:
    """For each of ``tables`` in both refresh documents (core/publication/subscription_filters.py ``filters_document``) whose
    initial-copy filter or column list differs: what changed, in words."""
    old, new = _entries(before), _entries(after)
    changes: dict[TableName, str] = {}
    for table in sorted(tables):
        if table not in old or table not in new or old[table] == new[table]:
            continue
        (old_filter, old_columns), (new_filter, new_columns) = old[table], new[table]
        said = []
        if old_filter != new_filter:
            said.append(f"its initial-copy filter changed from {old_filter or 'all rows'} to {new_filter or 'all rows'}")
        if old_columns != new_columns:
            said.append(f"its column list changed from {_columns(old_columns)} to {_columns(new_columns)}")
        changes[table] = "; ".join(said)
    return changes
