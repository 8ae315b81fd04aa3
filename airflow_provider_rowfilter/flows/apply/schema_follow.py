"""``schema_changes: follow``: the publisher's schema changes a batch's relations show, applied to the subscriber.

PostgreSQL replicates no DDL; its apply worker stops at a relation the subscriber's table does not
match (relation.c ``logicalrep_rel_open``: "missing replicated column"). pgoutput sends a RELATION
message before the first change after a schema change (pgoutput.c ``maybe_send_schema``), so the
change log's segments record, in stream order, each shape a table had (core/apply/relation_checks.py
``RelationSpan``). With ``follow`` the batch plan compares them with the subscriber's table
(:func:`plan_changes`) and the batch's one transaction runs the DDL before it applies the changes
(:func:`run_changes`, apply/batch_transaction.py), so the DDL and the rows commit together or not at all:

- a column added (the span has a column the table lacks): added with the publisher's type
  (``format_type`` of the OID and modifier pgoutput sent). The rows the subscriber already had get
  what the publisher's rows got when the column was added: the value ``ALTER TABLE … ADD COLUMN``
  stored for them (``pg_attribute.attmissingval``, tablecmds.c ``ATExecAddColumn``), its constant
  default, or NULL. A volatile default (each row its own value) cannot be known here: the batch stops.
- a column renamed (one span's column replaced by another at the same position, of the same type,
  the publisher's catalog showing no dropped attribute in between, as a drop and an add would leave):
  renamed on the subscriber, its values kept, when none of the batch's changes still carries the old
  name (the apply reads a change's columns by name): else the batch stops, naming it.
- a column dropped: kept (``follow``) or dropped (``follow_drops``), once the batch's rows are applied.
- a type changed to a wider one (``smallint``/``integer`` → ``bigint``, ``varchar(n)`` → ``varchar(m > n)``
  or ``text``, ``numeric`` precision up): widened. Another type change stops the batch untouched.

Each change is named in the batch's record (``rowfilter.batch_history.schema_changes``) as
"added column extra at 0/1F52B10". Tables with partitions (several leaves) are left to ``stop``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.core.apply.plan import EpochRules
from airflow_provider_rowfilter.core.apply.relation_checks import RelationSpan
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.identifiers import table_sql
from airflow_provider_rowfilter.subscriber.target_table import ApplyTarget, TargetColumn, read_target


class SchemaChangeError(RowFilterError):
    """A schema change on the publisher that ``schema_changes: follow`` cannot follow (nothing was applied)."""

    def __init__(self, message: str, *, lsn: int, detail: str, hint: str, table: str) -> None:
        super().__init__(message, detail=detail, hint=hint, table=table)
        self.lsn = lsn


@dataclass(frozen=True)
class SchemaChange:
    """One change to a subscriber table, at the LSN of the first change that carries it."""

    table: TableName
    kind: str  # add, rename, drop, widen
    column: str
    lsn: int
    type_sql: str | None = None  # add, widen: the publisher's type
    new_name: str | None = None  # rename
    existing_sql: str | None = None  # add: the SQL literal the rows already there get (None: NULL)
    default_sql: str | None = None  # add: the column's default from then on (the publisher's constant one)

    def describe(self) -> str:
        at = format_lsn(self.lsn)
        return {"add": f"added column {self.column} ({self.type_sql}) at {at}",
                "rename": f"renamed column {self.column} to {self.new_name} at {at}",
                "drop": f"dropped column {self.column} at {at}",
                "widen": f"changed column {self.column} to {self.type_sql} at {at}"}[self.kind]

    def statements(self) -> list[sql.Composable]:
        t, c = table_sql(self.table), sql.Identifier(self.column)
        if self.kind == "add":
            out: list[sql.Composable] = [sql.SQL("ALTER TABLE {} ADD COLUMN {} {}{}").format(
                t, c, sql.SQL(self.type_sql or "text"),
                sql.SQL("") if self.existing_sql is None else sql.SQL(" DEFAULT {}").format(sql.SQL(self.existing_sql)))]
            if self.default_sql != self.existing_sql:
                out.append(sql.SQL("ALTER TABLE {} ALTER COLUMN {} {}").format(
                    t, c, sql.SQL("DROP DEFAULT") if self.default_sql is None
                    else sql.SQL("SET DEFAULT {}").format(sql.SQL(self.default_sql))))
            return out
        if self.kind == "rename":
            return [sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(t, c, sql.Identifier(self.new_name or ""))]
        if self.kind == "drop":
            return [sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(t, c)]
        return [sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(t, c, sql.SQL(self.type_sql or "text"))]

    def as_dict(self) -> dict:
        d = {"table": str(self.table), "kind": self.kind, "column": self.column, "lsn": format_lsn(self.lsn),
             "text": self.describe()}
        if self.type_sql is not None:
            d["type"] = self.type_sql
        if self.new_name is not None:
            d["new_name"] = self.new_name
        return d


@dataclass(frozen=True)
class PublisherColumn:
    """A column of the publisher's table as its catalog says now (dropped ones included, by number)."""

    attnum: int
    name: str
    dropped: bool
    type_sql: str
    missing: str | None  # attmissingval's text, when atthasmissing
    has_missing: bool
    default_sql: str | None
    default_is_const: bool
    listed: bool  # a publication lists the table with a column list (pg_publication_rel.prattrs, PostgreSQL 15+)


#: The publisher's columns of a table, by its OID (pg_attribute, dropped ones included).
PUBLISHER_COLUMNS = """
SELECT a.attnum, a.attname, a.attisdropped, format_type(a.atttypid, a.atttypmod),
       CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END, a.atthasmissing,
       pg_get_expr(d.adbin, d.adrelid), coalesce(d.adbin::text LIKE '{CONST %%', false),
       EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel pr
               WHERE pr.prrelid = a.attrelid AND to_jsonb(pr) ->> 'prattrs' IS NOT NULL)
FROM pg_catalog.pg_attribute a LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s AND a.attnum > 0 ORDER BY a.attnum"""


def read_publisher_columns(pub: psycopg.Connection, oid: int) -> list[PublisherColumn]:
    return [PublisherColumn(*row) for row in pub.execute(PUBLISHER_COLUMNS, (oid,))]


_VARCHAR = re.compile(r"^character varying(?:\((\d+)\))?$")
_NUMERIC = re.compile(r"^numeric(?:\((\d+),(\d+)\))?$")
_INTEGERS = {"smallint": 0, "integer": 1, "bigint": 2}


def widens(old: str, new: str) -> bool:
    """Whether every value of type ``old`` is a value of ``new``, unchanged in its text form."""
    if old in _INTEGERS and new in _INTEGERS:
        return _INTEGERS[new] > _INTEGERS[old]
    v_old, v_new = _VARCHAR.match(old), _VARCHAR.match(new)
    if v_old and (new == "text" or (v_new and (v_new.group(1) is None or (
            v_old.group(1) is not None and int(v_new.group(1)) > int(v_old.group(1)))))):
        return True
    n_old, n_new = _NUMERIC.match(old), _NUMERIC.match(new)
    if n_old and n_new:
        if n_new.group(1) is None:
            return True
        if n_old.group(1) is None:
            return False
        p, s, p2, s2 = int(n_old.group(1)), int(n_old.group(2)), int(n_new.group(1)), int(n_new.group(2))
        return s2 == s and p2 > p
    return False


def plan_changes(mode: str, target: ApplyTarget, leaves: Sequence[TableName], position: int,
                 spans: Sequence[RelationSpan], publisher: Callable[[int], Sequence[PublisherColumn]],
                 ) -> tuple[ApplyTarget, list[SchemaChange]]:
    """The changes ``target`` needs for the relations of the batch's ``spans``, and the target as they leave it.

    ``publisher(oid)`` reads the publisher's catalog (asked only when a span differs from the table).

    :raises SchemaChangeError: a change that cannot be followed, naming it, its LSN and the fix.
    """
    if len(leaves) != 1:
        return target, []
    mine = sorted((s for s in spans if s.name == leaves[0] and s.due_from(position) is not None),
                  key=lambda s: s.first_lsn)
    columns = list(target.columns)
    changes: list[SchemaChange] = []
    previous: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    catalog: list[PublisherColumn] | None = None
    for span in mine:
        names, types = span.column_names, span.column_types
        have = {c.name: c for c in columns}
        new_names = [n for n in names if n not in have and n not in target.generated]
        if not new_names and (previous is None or previous[0] == names) and \
                all(have[n].type_sql == t for n, t in zip(names, types, strict=True) if n in have):
            previous = (names, types)
            continue
        at = span.first_lsn
        if new_names and catalog is None:
            catalog = list(publisher(span.oid))
        before = previous[0] if previous is not None else tuple(c.name for c in columns)
        before_types = previous[1] if previous is not None else tuple(have[n].type_sql for n in before)
        renamed: dict[str, str] = {}
        for name in new_names:
            assert catalog is not None
            i = names.index(name)
            old = _renamed_from(before, before_types, names, types, i, catalog)
            if old is not None and old in have:
                renamed[name] = old
            elif previous is None:
                # The shape before is the subscriber's own table: a column it has that the publisher no longer
                # sends, of the same type, may be the one renamed. Followed only when told apart above.
                live = {c.name for c in catalog if not c.dropped}
                alike = [c.name for c in columns if c.name not in names and c.name not in live
                         and c.type_sql == types[i]]
                if alike:
                    raise _unfollowed(target.table, at, f'column "{name}" ({types[i]}) added, or "{alike[0]}" '
                                      f"renamed to it", f'ALTER TABLE {target.table} RENAME COLUMN "{alike[0]}" TO '
                                      f'"{name}", or ADD COLUMN "{name}" {types[i]}',
                                      why=f'the subscriber\'s column "{alike[0]}" is no longer published and the '
                                      "relation before the change is not in the batch, so a rename cannot be told "
                                      "from a column added")
        for new, old in renamed.items():
            if previous is not None:  # the batch's changes before the rename carry the old name
                raise _unfollowed(target.table, at, f'column "{old}" renamed to "{new}"',
                                  f'ALTER TABLE {target.table} RENAME COLUMN "{old}" TO "{new}", then `rowfilter '
                                  f"resync --table {target.table} --copy`",
                                  why="changes under both names are in this batch, and the apply reads a change's "
                                  "columns by name")
            changes.append(SchemaChange(target.table, "rename", old, at, new_name=new))
            columns = [replace(c, name=new) if c.name == old else c for c in columns]
        have = {c.name: c for c in columns}
        was_types = dict(zip(*previous, strict=True)) if previous is not None else {}
        for name, type_sql in zip(names, types, strict=True):
            if name in target.generated:
                continue
            if name not in have:
                assert catalog is not None
                change = _added(target.table, name, type_sql, at, catalog)
                changes.append(change)
                columns.append(TargetColumn(name, type_sql, change.existing_sql))
                continue
            now = have[name].type_sql
            if now == type_sql:
                continue
            if widens(now, type_sql):
                changes.append(SchemaChange(target.table, "widen", name, at, type_sql=type_sql))
                columns = [replace(c, type_sql=type_sql) if c.name == name else c for c in columns]
            elif name in was_types and was_types[name] != type_sql:
                raise _unfollowed(target.table, at, f'column "{name}" changed from {was_types[name]} to '
                                  f"{type_sql}", f"ALTER TABLE {target.table} ALTER COLUMN {name} TYPE {type_sql} "
                                  "USING …")
        if previous is not None and mode == "follow_drops":
            for name in previous[0]:
                if name not in names and name not in renamed.values() and name in {c.name for c in columns} \
                        and name not in target.key:
                    changes.append(SchemaChange(target.table, "drop", name, at))  # after the rows (run_changes)
        previous = (names, types)
    if not changes:
        return target, []
    key = tuple(next((new for new, old in _renames(changes) if old == k), k) for k in target.key)
    return replace(target, columns=tuple(columns), key=key), changes


def _renames(changes: Sequence[SchemaChange]) -> list[tuple[str, str]]:
    return [(c.new_name or "", c.column) for c in changes if c.kind == "rename"]


def _type_changed(previous: tuple[tuple[str, ...], tuple[str, ...]] | None, names: Sequence[str],
                  types: Sequence[str]) -> bool:
    if previous is None:
        return False
    was = dict(zip(*previous, strict=True))
    return any(n in was and was[n] != t for n, t in zip(names, types, strict=True))


def _renamed_from(before: Sequence[str], before_types: Sequence[str], names: Sequence[str], types: Sequence[str],
                  i: int, catalog: Sequence[PublisherColumn]) -> str | None:
    """The column that ``names[i]`` renamed, or None when it was added.

    pgoutput lists the live columns in attribute-number order (logicalrep_write_attrs in proto.c), so a
    rename keeps the column's place and its number: the column before it is the same in both relations,
    the old name is gone from the new one, and the publisher's catalog holds the new name at a number
    below which, after the previous column's, no dropped attribute lies (a DROP and an ADD leave one).
    """
    if i >= len(before) or before[i] in names or before_types[i] != types[i]:
        return None
    if i and before[i - 1] != names[i - 1]:
        return None
    by_name = {c.name: c for c in catalog if not c.dropped}
    new = by_name.get(names[i])
    if new is None:
        return None
    after = by_name[names[i - 1]].attnum if i and names[i - 1] in by_name else 0
    if any(c.dropped and after < c.attnum < new.attnum for c in catalog):
        return None
    if i + 1 < len(names) and names[i + 1] in by_name and by_name[names[i + 1]].attnum < new.attnum:
        return None
    return before[i]


def _added(table: TableName, name: str, type_sql: str, at: int, catalog: Sequence[PublisherColumn]) -> SchemaChange:
    """A column added on the publisher: what its rows got then, from its catalog."""
    column = next((c for c in catalog if c.name == name and not c.dropped), None)
    if column is None or column.type_sql != type_sql:
        raise _unfollowed(table, at, f'column "{name}" ({type_sql}) added', f"ALTER TABLE {table} ADD COLUMN "
                          f"{name} {type_sql}, then `rowfilter reconcile --table {table}`",
                          why="the publisher's table no longer has it as the batch's changes carry it (changed again "
                          "since), so what its rows got when it was added is not known")
    if column.listed:
        raise _unfollowed(table, at, f'column "{name}" ({type_sql}) published', f"ALTER TABLE {table} ADD COLUMN "
                          f"{name} {type_sql} in the subscriber, run again, then `rowfilter reconcile --table {table}`",
                          why="the table is published with a column list: the column may have been added to the list "
                          "(ALTER PUBLICATION … SET TABLE), and the rows already there then hold values only the "
                          "publisher's rows have")
    const = column.default_sql if column.default_is_const else None
    if column.has_missing:
        existing = "'" + (column.missing or "").replace("'", "''") + "'::" + type_sql
    elif column.default_sql is None:
        existing = None
    elif const is not None:
        existing = const
    else:
        raise _unfollowed(table, at, f'column "{name}" ({type_sql}) added with DEFAULT {column.default_sql}',
                          f"ALTER TABLE {table} ADD COLUMN {name} {type_sql} in the subscriber, run again, then "
                          f"`rowfilter reconcile --table {table}` (repairs the rows in place)",
                          why="its default gives each row its own value, which only the publisher's rows hold")
    return SchemaChange(table, "add", name, at, type_sql=type_sql, existing_sql=existing, default_sql=const)


def _unfollowed(table: TableName, at: int, what: str, fix: str, why: str | None = None) -> SchemaChangeError:
    return SchemaChangeError(
        f"table {table}: schema change not followed: {what} at {format_lsn(at)}", lsn=at, table=str(table),
        detail=(f"{why}. " if why else "schema_changes: follow widens a type only where every value stays the same "
                "(smallint/integer to bigint, varchar(n) to a longer varchar or text, numeric precision up). ")
        + "Nothing of the batch was applied.",
        hint=f"change the subscriber's table yourself ({fix}) and run again; the change log keeps the batch")


def renamed_rules(table: TableName, rules: Sequence[EpochRules | None], starts: Sequence[int],
                  renames: Sequence[tuple[TableName, str, str | None, str]]) -> tuple[EpochRules | None, ...]:
    """``table``'s definitions of each epoch (starting at ``starts``) after the renames followed since its refresh
    recorded them (``renames``: table, old, new, LSN; oldest first): PostgreSQL's own follow the rename."""
    out = []
    for epoch, r in enumerate(rules):
        for t, old, new, lsn in renames:
            if r is not None and new is not None and t == table and parse_lsn(lsn) > starts[epoch]:
                r = r.renamed(old, new)
        out.append(r)
    return tuple(out)


def run_changes(conn: psycopg.Connection, changes: Sequence[SchemaChange], *, after: bool = False) -> None:
    """The DDL of ``changes``, in the caller's (the batch's) transaction: before the table's rows, or (``after``)
    the drops once its rows are applied, since the batch's changes before a drop still carry the column."""
    for change in changes:
        if (change.kind == "drop") != after:
            continue
        for statement in change.statements():
            conn.execute(statement)


def plan_all(mode: str, targets: Mapping[int, ApplyTarget], leaves_of: Mapping[int, Sequence[TableName]],
             positions: Mapping[int, int], spans: Sequence[RelationSpan],
             publisher: Callable[[int], Sequence[PublisherColumn]]) -> dict[int, list[SchemaChange]]:
    """:func:`plan_changes` for every target; ``targets`` updated in place to the shapes the changes leave."""
    cached: dict[int, Sequence[PublisherColumn]] = {}

    def read(oid: int) -> Sequence[PublisherColumn]:
        if oid not in cached:
            cached[oid] = publisher(oid)
        return cached[oid]

    found: dict[int, list[SchemaChange]] = {}
    for index, target in list(targets.items()):
        shaped, changes = plan_changes(mode, target, leaves_of[index], positions[index], spans, read)
        if changes:
            targets[index] = shaped
            found[index] = changes
    return found


#: The publisher's live, non-generated columns of a table by name (``to_regclass``: NULL when it has none so named).
_PUBLISHED_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a
WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum"""


def pending_differences(pub: psycopg.Connection, sub: psycopg.Connection,
                        tables: Sequence[tuple[TableName, Sequence[str] | None]]) -> list[str]:
    """How each table of the subscriber differs from the publisher's now (``rowfilter status``): what the next batches
    will follow (``schema_changes: follow``) or stop on (``stop``). ``tables``: each with its column list, if any."""
    found = []
    for table, column_list in tables:
        theirs = dict(pub.execute(_PUBLISHED_COLUMNS, (table_sql(table).as_string(pub),)).fetchall())
        if not theirs:
            found.append(f"{table}: no such table on the publisher (renamed or moved there?)")
            continue
        try:
            mine = {c.name: c.type_sql for c in read_target(sub, table, 0).columns}
        except RowFilterError:
            found.append(f"{table}: no such table in the subscriber")
            continue
        published = [c for c in theirs if column_list is None or c in column_list]
        for name in published:
            if name not in mine:
                found.append(f"{table}: column {name} ({theirs[name]}) is on the publisher, not in the subscriber")
            elif mine[name] != theirs[name]:
                found.append(f"{table}: column {name} is {theirs[name]} on the publisher, {mine[name]} in the subscriber")
        if column_list is None:
            found += [f"{table}: column {name} is in the subscriber, not on the publisher (renamed or dropped there, "
                      "or the subscriber's own)" for name in mine if name not in theirs]
    return found
