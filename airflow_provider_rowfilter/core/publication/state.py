"""What the publisher's catalog says of a subscription's publications, as a refresh recorded it and as it is now.

With ``filtering: spark`` and the definitions read from the publisher's catalog, the apply judges each
change by the definitions the last refresh recorded, while PostgreSQL's pgoutput reads the
publications in the decoding's historic snapshot, as of each change's position (``get_rel_sync_entry``
rebuilt on ``rel_sync_cache_publication_cb`` in src/backend/replication/pgoutput/pgoutput.c). An
``ALTER PUBLICATION`` committed after that refresh would be followed natively and not here: so each
apply batch holds the publisher's catalog now against what the refresh recorded (one query,
publisher/catalog_reader.py ``read_publication_state``), and stops untouched when they differ
(:class:`PublicationChangedError`, naming what changed).

The *state* is a JSON-ready dict (stored in the refresh's definitions document under ``publisher``):

- ``publications``: per publication of the subscription, its ``pg_publication`` settings (FOR ALL
  TABLES, the publish actions, ``publish_via_partition_root``, ``publish_generated_columns``);
- ``members``: per publication, the subscribed tables (and their partition ancestors) it lists in
  ``pg_publication_rel``, each with its row filter (``pg_get_expr``) and column list;
- ``schemas``: per publication, the schemas of subscribed tables it publishes (``TABLES IN SCHEMA``);
- ``partitions``: per subscribed table that has them, its partitions (``pg_inherits``);
- ``generated``: per subscribed table, its generated columns (which ``publish_generated_columns`` governs);
- ``present``: the subscribed tables that exist under their name.

What the change stream itself carries at each change's position is not part of it: a column added to
a table (its Relation message lists it), a replica identity switched (the old tuple is the key or the
full row as the publisher logged it), a column renamed or a table renamed (core/apply/relation_checks.py
``check_relations``). A table missing now is left out of the comparison: dropped, it sends nothing
more; renamed, its next change stops the batch by ``check_relations``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.filters.pg_lexer import scan

_SETTINGS = ("all_tables", "publish", "publish_via_partition_root", "publish_generated_columns")


class PublicationChangedError(RowFilterError):
    """The publisher's publications changed since the refresh whose definitions the apply judges with."""


def _without(state: dict, gone: set[str]) -> dict:
    """``state`` restricted to the tables present in both readings."""
    def keep(table: str) -> bool:
        return table not in gone

    return {
        "publications": state.get("publications", {}),
        "members": {p: {t: v for t, v in m.items() if keep(t)} for p, m in state.get("members", {}).items()},
        "schemas": state.get("schemas", {}),
        "partitions": {t: v for t, v in state.get("partitions", {}).items() if keep(t)},
        "generated": {t: v for t, v in state.get("generated", {}).items() if keep(t)},
    }


def changes(recorded: dict, current: dict) -> list[str]:
    """What changed from ``recorded`` to ``current``, one sentence each (empty: nothing that matters)."""
    gone = set(recorded.get("present", ())) ^ set(current.get("present", ()))
    old, new = _without(recorded, gone), _without(current, gone)
    out: list[str] = []
    for pub in sorted(set(old["publications"]) | set(new["publications"])):
        before, after = old["publications"].get(pub), new["publications"].get(pub)
        if before is None or after is None:
            out.append(f"publication {pub} {'was created' if before is None else 'no longer exists'}")
            continue
        for key in _SETTINGS:
            if before.get(key) != after.get(key):
                out.append(f"publication {pub}: {key} changed from {_text(before.get(key))} to "
                           f"{_text(after.get(key))}")
    for pub in sorted(set(old["members"]) | set(new["members"])):
        before, after = old["members"].get(pub, {}), new["members"].get(pub, {})
        for table in sorted(set(before) | set(after)):
            if table not in after:
                out.append(f"table {table}: dropped from publication {pub}")
            elif table not in before:
                out.append(f"table {table}: added to publication {pub}")
            else:
                (f0, c0), (f1, c1) = before[table], after[table]
                if f0 != f1:
                    out.append(f"table {table} in publication {pub}: row filter changed from {_filter(f0)} to "
                               f"{_filter(f1)}")
                if c0 != c1:
                    out.append(f"table {table} in publication {pub}: column list changed from {_columns(c0)} to "
                               f"{_columns(c1)}")
    for pub in sorted(set(old["schemas"]) | set(new["schemas"])):
        before, after = set(old["schemas"].get(pub, ())), set(new["schemas"].get(pub, ()))
        out += [f"publication {pub}: schema {s} added (TABLES IN SCHEMA)" for s in sorted(after - before)]
        out += [f"publication {pub}: schema {s} dropped (TABLES IN SCHEMA)" for s in sorted(before - after)]
    for key, what in (("partitions", "partitions"), ("generated", "generated columns")):
        for table in sorted(set(old[key]) | set(new[key])):
            before, after = old[key].get(table, []), new[key].get(table, [])
            if before != after:
                out.append(f"table {table}: {what} changed from {_columns(before or None)} to "
                           f"{_columns(after or None)}")
    return out


def renamed_state(recorded: dict, renames: Sequence[tuple[str, str, str]]) -> dict:
    """``recorded`` as the publisher shows it after the column renames ``renames`` (table, old, new; in order) that
    ``schema_changes: follow`` followed: PostgreSQL's stored filter and column list follow a rename (by attribute
    number), so ``pg_get_expr`` shows the new name where the recording has the old one; nothing else differs."""
    members = {pub: dict(m) for pub, m in recorded.get("members", {}).items()}
    for table, old, new in renames:
        for m in members.values():
            if table in m:
                qual, cols = m[table]
                m[table] = [None if qual is None else _renamed_in(qual, old, new),
                            None if cols is None else [new if c == old else c for c in cols]]
    return {**recorded, "members": members}


def _renamed_in(text: str, old: str, new: str) -> str:
    """``pg_get_expr`` text with the column ``old`` read as ``new`` (a name followed by ``(`` is a function's)."""
    quoted = new if re.fullmatch(r"[a-z_][a-z0-9_$]*", new) else '"' + new.replace('"', '""') + '"'
    out, at = [], 0
    for token in scan(text):
        name = token.value if token.kind == "ident" else text[token.start + 1:token.end - 1].replace('""', '"') \
            if token.kind == "qident" else None
        if name == old and not text[token.end:].lstrip().startswith("(") \
                and not text[:token.start].rstrip().endswith("."):
            out += [text[at:token.start], quoted]
            at = token.end
    return "".join(out) + text[at:]


def drift_error(subscription: str, refreshed_at: str, found: list[str], batch: str) -> PublicationChangedError:
    """The batch stops untouched: the publisher's publications are no longer what the refresh recorded."""
    return PublicationChangedError(
        f"subscription {subscription!r}: the publisher's publications changed since the refresh at {refreshed_at}: "
        + "; ".join(found),
        detail=f"PostgreSQL judges each change by the publications as of its position; this subscription judges them "
        f"in Spark (filtering: spark) by the definitions the refresh recorded, so the changes committed after the "
        f"ALTER would be judged by the old ones. Nothing of the batch ({batch}) was applied.",
        hint="run `rowfilter refresh`: the new definitions then judge the changes committed from the refresh's "
        "position on, and the changes already in the change log are judged by the old ones, as are those committed "
        "between the ALTER and the refresh (PostgreSQL would judge those by the new ones). To make a table whose "
        "definition changed exact, run `rowfilter resync --table T` after the refresh (a new copy under the new "
        "definition). To have the publisher judge every change where PostgreSQL does, use filtering: source "
        "(PostgreSQL 15+, definitions in its catalog)")


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "(" + ", ".join(map(str, value)) + ")"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _filter(text: str | None) -> str:
    return "none" if text is None else f"WHERE {text}"


def _columns(columns: list[str] | None) -> str:
    return "none" if columns is None else "(" + ", ".join(columns) + ")"
