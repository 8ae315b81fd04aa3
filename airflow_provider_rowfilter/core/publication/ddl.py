"""Publications defined by a file of ``CREATE``/``ALTER``/``DROP PUBLICATION`` statements.

The statements are applied in order to an empty set of publications, checked against the
publisher's catalog with PostgreSQL's own rules and error texts (publicationcmds.c,
pg_publication.c), so a file that PostgreSQL 18 would reject is rejected here with the same words.
PostgreSQL 19's forms are read too, whatever the publisher's version (the file defines the publications for us, not
for the publisher): ``FOR ALL TABLES EXCEPT (TABLE …)``, ``FOR ALL SEQUENCES``, ``ALTER PUBLICATION … SET ALL
TABLES [EXCEPT (…)], ALL SEQUENCES``, with 19's rules and texts (its publicationcmds.c ``CreatePublication``,
``CheckAlterPublication``, ``AlterPublicationTables``; pg_publication.c ``check_publication_add_relation``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace

from sqlglot import exp

from airflow_provider_rowfilter.core.errors import PublicationError, RowFilterError
from airflow_provider_rowfilter.core.filters.dialect import (
    AlterPublication,
    CreatePublication,
    DropPublication,
    PublicationExceptSpec,
    PublicationOption,
    PublicationSchemaSpec,
    PublicationTableSpec,
    identifier_name,
    parse_statements,
)
from airflow_provider_rowfilter.core.filters.row_filter import validate_row_filter
from airflow_provider_rowfilter.core.filters.stack_depth import deep_stack
from airflow_provider_rowfilter.core.publication.catalog import SYSTEM_SCHEMAS, PublisherCatalog, publishable
from airflow_provider_rowfilter.core.publication.model import (
    Publication,
    PublicationSet,
    PublishAction,
    PublishedTable,
)
from airflow_provider_rowfilter.core.publication.script_excerpt import STATEMENT_WORDS, quoting_only_sql
from airflow_provider_rowfilter.core.relation import SYSTEM_COLUMNS, Relation, RelKind, TableName

#: Set by :func:`table_refusals`: a table's refused row filter is kept on its entry instead of raised.
_DEFER_FILTER_ERRORS: ContextVar[bool] = ContextVar("defer_filter_errors", default=False)


@contextmanager
def table_refusals() -> Iterator[None]:
    """Within it, :func:`publications_from_ddl` keeps a table whose row filter it refuses (``entry.refusal``),
    so that the subscription refuses that table alone (``on_invalid_table: skip``); every other error of
    the file still refuses the file, as PostgreSQL refuses the statement."""
    token = _DEFER_FILTER_ERRORS.set(True)
    try:
        yield
    finally:
        _DEFER_FILTER_ERRORS.reset(token)


@deep_stack
def publications_from_ddl(sql: str, catalog: PublisherCatalog, base: PublicationSet | None = None) -> PublicationSet:
    """Apply a script of publication statements to ``base`` (default: none) and return the result.

    Its errors quote the script only inside an SQL statement, secrets masked (core/publication/script_excerpt.py): the
    script is a file a spec named, which may be any file. Parsed on a deep stack (core/filters/stack_depth.py).
    """
    with quoting_only_sql(sql):
        return _apply_script(sql, catalog, base)


def _apply_script(sql: str, catalog: PublisherCatalog, base: PublicationSet | None) -> PublicationSet:
    result = PublicationSet(dict(base.publications) if base is not None else {})
    for statement in parse_statements(sql, server_version_num=catalog.server_version_num):
        if isinstance(statement, CreatePublication):
            _create(statement, result, catalog)
        elif isinstance(statement, AlterPublication):
            _alter(statement, result, catalog)
        elif isinstance(statement, DropPublication):
            _drop(statement, result)
        elif isinstance(statement, exp.Command) and statement.name.upper() in ("SET", "RESET", "BEGIN", "COMMIT"):
            continue
        else:
            # Named by its kind only: the statement may be a line of a file that is not SQL (a secret's assignment).
            raise PublicationError(
                f"unexpected statement in a publications file: {_statement_kind(statement)}",
                hint="the file may hold only CREATE, ALTER and DROP PUBLICATION statements",
            )
    return result


def _statement_kind(statement: exp.Expr) -> str:
    """``a SELECT statement``, ``a CREATE statement``…; or that it is no SQL statement (no text of it)."""
    word = statement.name.upper() if isinstance(statement, exp.Command) else statement.key.upper()
    if word in STATEMENT_WORDS:
        return f"a {word} statement"
    return "text that is not an SQL statement (check that publications_ddl names the right file)"


# --- options ----------------------------------------------------------------------------------------
def _options(options: list[PublicationOption], current: Publication) -> dict[str, object]:
    """publicationcmds.c ``parse_publication_options``."""
    seen: set[str] = set()
    changes: dict[str, object] = {}
    for opt in options:
        key = identifier_name(opt.this)
        if key in seen:
            raise PublicationError("conflicting or redundant options")
        seen.add(key)
        value = _option_text(opt.args.get("value"))
        if key == "publish":
            if value is None:
                raise PublicationError("publish requires a parameter")
            actions = set()
            for token in value.split(","):
                token = token.strip()
                if not token:
                    continue
                if token not in {a.value for a in PublishAction}:
                    raise PublicationError(f'unrecognized value for publication option "publish": "{token}"')
                actions.add(PublishAction(token))
            changes["actions"] = frozenset(actions)
        elif key == "publish_via_partition_root":
            changes["via_root"] = _boolean(key, value)
        elif key == "publish_generated_columns":
            if value not in ("none", "stored"):
                raise PublicationError(
                    f'invalid value for publication parameter "publish_generated_columns": "{value}"',
                    detail='Valid values are "none" and "stored".')
            changes["publish_generated_columns"] = value
        else:
            raise PublicationError(f'unrecognized publication parameter: "{key}"')
    return changes


def _option_text(value: exp.Expr | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, exp.Boolean):
        return "true" if value.this else "false"
    if isinstance(value, exp.Identifier):
        return identifier_name(value)
    return str(value.this if isinstance(value, exp.Literal) else value.name)


def _boolean(key: str, value: str | None) -> bool:
    if value is None:
        return True
    lowered = value.strip().lower()
    if lowered in ("true", "on", "1", "t", "yes", "y"):
        return True
    if lowered in ("false", "off", "0", "f", "no", "n"):
        return False
    raise PublicationError(f"{key} requires a Boolean value")


# --- objects ----------------------------------------------------------------------------------------
def _open_table(table: exp.Expr, pub: Publication, catalog: PublisherCatalog) -> Relation:
    """A table a statement names, as publicationcmds.c ``OpenTableList`` opens it (``relation does not exist``)."""
    schema = identifier_name(table.args.get("db")) or None
    name = identifier_name(table.this)
    rel = catalog.resolve(schema, name)
    if rel is None:
        qualified = f"{schema}.{name}" if schema else name
        raise PublicationError(f'relation "{qualified}" does not exist', publication=pub.name)
    return rel


def _table_entries(
    specs: list[exp.Expr], pub: Publication, catalog: PublisherCatalog, *, dropping: bool = False
) -> list[PublishedTable]:
    """publicationcmds.c ``OpenTableList`` + ``TransformPubWhereClauses`` + ``CheckPubRelationColumnList``."""
    entries: dict[TableName, PublishedTable] = {}
    for spec in specs:
        if not isinstance(spec, PublicationTableSpec):
            continue
        rel = _open_table(spec.this, pub, catalog)
        where = spec.args.get("where")
        columns = spec.args.get("columns")
        if dropping and columns is not None:
            raise PublicationError("column list must not be specified in ALTER PUBLICATION ... DROP",
                                   publication=pub.name, table=str(rel.name))
        if dropping and where is not None:
            raise PublicationError("cannot use a WHERE clause when removing a table from a publication",
                                   publication=pub.name, table=str(rel.name))
        names = [rel.name]
        if not spec.args.get("only") and not dropping:
            names += list(rel.inheritance_children)
        for member in names:
            filter_sql = spec.args.get("filter_sql") if where is not None else None
            col_names = tuple(identifier_name(c) for c in columns) if columns is not None else None
            previous = entries.get(member)
            if previous is not None:
                if filter_sql is not None or previous.row_filter is not None:
                    raise PublicationError(f'conflicting or redundant WHERE clauses for table "{member.name}"',
                                           publication=pub.name)
                if col_names is not None or previous.columns is not None:
                    raise PublicationError(f'conflicting or redundant column lists for table "{member.name}"',
                                           publication=pub.name)
                continue
            entries[member] = PublishedTable(member, filter_sql, col_names)
    return list(entries.values())


def _check_table(entry: PublishedTable, pub: Publication, catalog: PublisherCatalog) -> PublishedTable:
    """Check one table of a publication as PostgreSQL does; return it with its validated row filter."""
    rel = catalog.relation(entry.table)
    if not publishable(rel):
        raise PublicationError(f'cannot add relation "{rel.name.name}" to publication',
                               detail=f"This operation is not supported for {_not_publishable(rel)}.",
                               publication=pub.name)
    if entry.row_filter is not None:
        if rel.is_partitioned and not pub.via_root:
            raise PublicationError(
                f'cannot use publication WHERE clause for relation "{rel.name.name}"',
                detail="WHERE clause cannot be used for a partitioned table when publish_via_partition_root is false.",
                publication=pub.name, table=str(rel.name))
        try:
            entry = replace(entry, filter=validate_row_filter(entry.row_filter, rel, catalog.filter_context))
        except RowFilterError as e:
            refused = e.with_context(publication=pub.name, table=str(rel.name))
            if not _DEFER_FILTER_ERRORS.get():
                raise refused from None
            entry = replace(entry, refusal=refused)
    if entry.columns is not None:
        if pub.schemas:
            raise PublicationError(
                f'cannot use column list for relation "{rel.name}" in publication "{pub.name}"',
                detail="Column lists cannot be specified in publications containing FOR TABLES IN SCHEMA elements.",
                publication=pub.name, table=str(rel.name))
        if rel.is_partitioned and not pub.via_root:
            raise PublicationError(
                f'cannot use column list for relation "{rel.name}" in publication "{pub.name}"',
                detail="Column lists cannot be specified for partitioned tables when publish_via_partition_root is false.",
                publication=pub.name, table=str(rel.name))
        seen: set[str] = set()
        for name in entry.columns:
            if name in SYSTEM_COLUMNS and rel.column(name) is None:
                raise PublicationError(f'cannot use system column "{name}" in publication column list',
                                       publication=pub.name, table=str(rel.name))
            col = rel.column(name)
            if col is None:
                raise PublicationError(f'column "{name}" of relation "{rel.name.name}" does not exist',
                                       publication=pub.name, table=str(rel.name))
            if col.generated == "v":
                raise PublicationError(f'cannot use virtual generated column "{name}" in publication column list',
                                       publication=pub.name, table=str(rel.name))
            if name in seen:
                raise PublicationError(f'duplicate column "{name}" in publication column list',
                                       publication=pub.name, table=str(rel.name))
            seen.add(name)
    return entry


def _not_publishable(rel) -> str:
    """What kind of relation ``rel`` is that no publication may hold (errdetail_relkind_not_supported, and
    check_publication_add_relation's persistence and system-table details)."""
    why = {
        RelKind.VIEW: "views", RelKind.MATERIALIZED_VIEW: "materialized views",
        RelKind.FOREIGN: "foreign tables", RelKind.SEQUENCE: "sequences",
    }.get(rel.relkind)
    if why is None:
        why = {"u": "unlogged tables", "t": "temporary tables"}.get(rel.persistence, "system tables")
    return why


def _except_tables(specs: list[exp.Expr], pub: Publication, catalog: PublisherCatalog) -> tuple[TableName, ...]:
    """PostgreSQL 19's EXCEPT list: each table opened as OpenTableList opens it (``relation does not exist``; with its
    inheritance children unless ONLY, a partitioned table without its partitions; duplicates dropped), then checked
    as check_publication_add_relation checks an EXCEPT table: a partition is refused (only the root of a partition
    tree may be excluded), as is what no publication may hold, each naming the table schema-qualified."""
    names: list[TableName] = []
    for spec in specs:
        if not isinstance(spec, PublicationExceptSpec):
            continue
        rel = _open_table(spec.this, pub, catalog)
        members = [rel.name] + ([] if spec.args.get("only") or rel.is_partitioned else list(rel.inheritance_children))
        names += [m for m in members if m not in names]
    for member in names:
        rel = catalog.relation(member)
        refused = f'cannot specify relation "{rel.name}" in the publication EXCEPT clause'
        if rel.is_partition:
            raise PublicationError(refused, detail="This operation is not supported for individual partitions.",
                                   publication=pub.name, table=str(rel.name))
        if not publishable(rel):
            raise PublicationError(refused, detail=f"This operation is not supported for {_not_publishable(rel)}.",
                                   publication=pub.name, table=str(rel.name))
    return tuple(names)


def _schemas(specs: list[exp.Expr], pub: Publication, catalog: PublisherCatalog) -> list[str]:
    names: list[str] = []
    for spec in specs:
        if not isinstance(spec, PublicationSchemaSpec):
            continue
        name = identifier_name(spec.this) if spec.this is not None else catalog.search_path[0]
        if name not in catalog.schemas:
            raise PublicationError(f'schema "{name}" does not exist', publication=pub.name)
        if name in SYSTEM_SCHEMAS:
            raise PublicationError(f'cannot add schema "{name}" to publication',
                                   detail="This operation is not supported for system schemas.", publication=pub.name)
        if name not in names:
            names.append(name)
    return names


def _all_tables_error(pub: Publication, schemas: bool, catalog: PublisherCatalog) -> PublicationError:
    """CheckAlterPublication: no table or schema is added to or dropped from a FOR ALL TABLES or (19) FOR ALL
    SEQUENCES publication. PostgreSQL 19 says "Tables or sequences" where 18 says "Tables": the text of the
    publisher's version, and 19's for what only 19 has (FOR ALL SEQUENCES)."""
    kind = ", ".join(k for k, on in (("ALL TABLES", pub.all_tables), ("ALL SEQUENCES", pub.all_sequences)) if on)
    objects = "Schemas" if schemas else (
        "Tables" if catalog.server_version_num < 190000 and not pub.all_sequences else "Tables or sequences")
    return PublicationError(f'publication "{pub.name}" is defined as FOR {kind}',
                            detail=f"{objects} cannot be added to or dropped from FOR {kind} publications.",
                            publication=pub.name)


def _check_publication(pub: Publication, catalog: PublisherCatalog) -> Publication:
    """``pub`` with each of its tables checked (their row filters validated once, and kept)."""
    return pub.with_changes(tables=tuple(_check_table(entry, pub, catalog) for entry in pub.tables))


# --- statements -------------------------------------------------------------------------------------
def _create(stmt: CreatePublication, pubs: PublicationSet, catalog: PublisherCatalog) -> None:
    name = identifier_name(stmt.this)
    if name in pubs:
        raise PublicationError(f'publication "{name}" already exists', publication=name)
    pub = Publication(name=name, all_tables=bool(stmt.args.get("all_tables")),
                      all_sequences=bool(stmt.args.get("all_sequences")))
    pub = pub.with_changes(**_options(stmt.args.get("options") or [], pub))
    specs = stmt.args.get("objects") or []
    if pub.all_tables or pub.all_sequences:  # PostgreSQL 19: FOR ALL TABLES [EXCEPT (…)], ALL SEQUENCES
        pubs.publications[name] = pub.with_changes(except_tables=_except_tables(specs, pub, catalog))
        return
    pub = pub.with_changes(schemas=tuple(_schemas(specs, pub, catalog)))
    pub = pub.with_changes(tables=tuple(_table_entries(specs, pub, catalog)))
    pubs.publications[name] = _check_publication(pub, catalog)


def _alter(stmt: AlterPublication, pubs: PublicationSet, catalog: PublisherCatalog) -> None:
    name = identifier_name(stmt.this)
    if name not in pubs:
        raise PublicationError(f'publication "{name}" does not exist', publication=name)
    pub = pubs[name]
    action = stmt.args["action"]
    if action == "OWNER":
        return
    if action == "RENAME":
        new_name = identifier_name(stmt.args["new_name"])
        if new_name in pubs:
            raise PublicationError(f'publication "{new_name}" already exists', publication=new_name)
        del pubs.publications[name]
        pubs.publications[new_name] = pub.with_changes(name=new_name)
        return
    if action == "SET_OPTIONS":
        # Only the options given change; the others keep their values (AlterPublicationOptions).
        updated = pub.with_changes(**_options(stmt.args.get("options") or [], pub))
        if updated.via_root is False and pub.via_root:
            for entry in pub.tables:
                rel = catalog.relation(entry.table)
                if rel.is_partitioned and (entry.row_filter is not None or entry.columns is not None):
                    kind = "a WHERE clause" if entry.row_filter is not None else "a column list"
                    raise PublicationError(
                        f'cannot set parameter "publish_via_partition_root" to false for publication "{name}"',
                        detail=f'The publication contains {kind} for partitioned table "{rel.name.name}", which is '
                        'not allowed when "publish_via_partition_root" is false.', publication=name)
        pubs.publications[name] = updated
        return

    specs = stmt.args.get("objects") or []
    if action == "SET_ALL":
        _alter_set_all(stmt, pub, pubs, catalog)
        return
    has_tables = any(isinstance(s, PublicationTableSpec) for s in specs)
    has_schemas = any(isinstance(s, PublicationSchemaSpec) for s in specs)
    if (pub.all_tables or pub.all_sequences) and (has_tables or has_schemas):
        raise _all_tables_error(pub, schemas=has_schemas, catalog=catalog)
    if action == "DROP":
        _alter_drop(pub, specs, pubs, catalog)
        return
    schemas = _schemas(specs, pub, catalog)
    entries = _table_entries(specs, pub, catalog)
    if action == "ADD":
        for entry in entries:
            if pub.table_entry(entry.table) is not None:
                raise PublicationError(f'relation "{entry.table.name}" is already member of publication "{name}"',
                                       publication=name)
        for schema in schemas:
            if schema in pub.schemas:
                raise PublicationError(f'schema "{schema}" is already member of publication "{name}"',
                                       publication=name)
        if schemas and any(e.columns is not None for e in pub.tables):
            raise PublicationError(f'cannot add schema to publication "{name}"',
                                   detail="Schemas cannot be added if any tables that specify a column list are "
                                   "already part of the publication.", publication=name)
        updated = pub.with_changes(schemas=pub.schemas + tuple(schemas))
    else:  # SET replaces both the table list and the schema list
        # (publicationcmds.c AlterPublicationTables/AlterPublicationSchemas, AP_SetObjects)
        updated = pub.with_changes(schemas=tuple(schemas))
    checked = _check_publication(updated.with_changes(tables=tuple(entries)), catalog).tables
    pubs.publications[name] = updated.with_changes(tables=(pub.tables if action == "ADD" else ()) + checked)


def _alter_set_all(stmt: AlterPublication, pub: Publication, pubs: PublicationSet, catalog: PublisherCatalog) -> None:
    """PostgreSQL 19's ``SET ALL TABLES [EXCEPT (…)]`` / ``SET ALL SEQUENCES`` (CheckAlterPublication,
    AlterPublicationTables, AlterPublicationAllFlags): only a publication without tables and schemas may be switched;
    both flags become the statement's (``SET ALL SEQUENCES`` turns ALL TABLES off), and the EXCEPT list is replaced
    (cleared without EXCEPT, or when ALL TABLES goes)."""
    all_tables, all_sequences = bool(stmt.args.get("all_tables")), bool(stmt.args.get("all_sequences"))
    if pub.tables or pub.schemas:
        operations = "ALL TABLES" if all_tables else "ALL SEQUENCES"
        raise PublicationError(
            f'publication "{pub.name}" does not support {operations} operations',
            detail="This operation requires the publication to be defined as FOR ALL TABLES/SEQUENCES or to be empty.",
            publication=pub.name)
    excepted = _except_tables(stmt.args.get("objects") or [], pub, catalog) if all_tables else ()
    pubs.publications[pub.name] = pub.with_changes(all_tables=all_tables, all_sequences=all_sequences,
                                                   except_tables=excepted)


def _alter_drop(pub: Publication, specs: list[exp.Expr], pubs: PublicationSet, catalog: PublisherCatalog) -> None:
    entries = _table_entries(specs, pub, catalog, dropping=True)
    schemas = _schemas(specs, pub, catalog)
    tables = list(pub.tables)
    for entry in entries:
        current = pub.table_entry(entry.table)
        if current is None:
            raise PublicationError(f'relation "{entry.table.name}" is not part of the publication', publication=pub.name)
        tables.remove(current)
        rel = catalog.relation(entry.table)
        spec_only = next((s.args.get("only") for s in specs if isinstance(s, PublicationTableSpec)), False)
        if not spec_only:
            tables = [t for t in tables if t.table not in rel.inheritance_children]
    remaining = list(pub.schemas)
    for schema in schemas:
        if schema not in remaining:
            raise PublicationError(f'tables from schema "{schema}" are not part of the publication',
                                   publication=pub.name)
        remaining.remove(schema)
    pubs.publications[pub.name] = pub.with_changes(tables=tuple(tables), schemas=tuple(remaining))


def _drop(stmt: DropPublication, pubs: PublicationSet) -> None:
    for ident in stmt.expressions:
        name = identifier_name(ident)
        if name not in pubs:
            if stmt.args.get("exists"):
                continue
            raise PublicationError(f'publication "{name}" does not exist', publication=name)
        del pubs.publications[name]
