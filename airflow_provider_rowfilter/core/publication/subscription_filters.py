"""What one subscription receives per table: effective row filters, column list, actions, copy filter.

This is pgoutput's ``get_rel_sync_entry``/``pgoutput_row_filter_init``/``pgoutput_column_list_init``
and tablesync's ``fetch_remote_table_info``, computed once for a set of subscribed publications.
Each function names the PostgreSQL function it mirrors (src/backend/replication/pgoutput/pgoutput.c,
src/backend/replication/logical/tablesync.c, src/backend/catalog/pg_publication.c).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlglot import exp, serde

from airflow_provider_rowfilter.core.errors import (
    ColumnListConflictError,
    PublicationError,
    ReplicaIdentityError,
    RowFilterError,
    UntranslatableFilterError,
)
from airflow_provider_rowfilter.core.filters.row_filter import RowFilter, evaluated_by_publisher, validate_row_filter
from airflow_provider_rowfilter.core.filters.spark_sql import NUMERIC_READS
from airflow_provider_rowfilter.core.filters.spark_translation import spark_or, to_spark_text
from airflow_provider_rowfilter.core.publication.catalog import PublisherCatalog, publishable
from airflow_provider_rowfilter.core.publication.model import (
    DML_ACTIONS,
    Publication,
    PublicationSet,
    PublishAction,
)
from airflow_provider_rowfilter.core.relation import Relation, RelKind, TableName


@dataclass(frozen=True, eq=False)
class TableFilters:
    """The subscription's view of one published table (``publish_as`` relation).

    ``filters[action]`` is ``None`` when the action is published without a filter, else the
    filters to OR; actions missing from ``filters`` are not published. ``copy_filters`` is the
    initial-copy condition (all publications, ``publish`` ignored; ``None`` = whole table).
    """

    table: TableName
    leaves: tuple[TableName, ...]
    actions: frozenset[PublishAction]
    filters: dict[PublishAction, tuple[RowFilter, ...] | None]
    copy_filters: tuple[RowFilter, ...] | None
    columns: tuple[str, ...] | None
    publications: tuple[str, ...]
    copy_only: bool = False  # ONLY: a regular table whose inheritance children are copied separately

    def filter_sql(self, action: PublishAction) -> str | None:
        """The effective filter of an action as PostgreSQL text (``None``: unfiltered or not published).

        For people and for PostgreSQL only (``rowfilter validate``, table synchronization's query): each
        filter as the user or ``pg_get_expr`` wrote it, which PostgreSQL parses itself. Spark gets
        :meth:`spark_filter`, built from the typed trees.
        """
        return _or_text(self.filters.get(action))

    @property
    def copy_filter_sql(self) -> str | None:
        return _or_text(self.copy_filters)

    def spark_filter(self, action: PublishAction) -> exp.Expr | None:
        """The effective filter of an action as one Spark expression tree (the filters ORed as trees)."""
        filters = self.filters.get(action)
        opaque = next((f.untranslatable for f in filters or () if f.untranslatable), None)
        if opaque is not None:
            raise UntranslatableFilterError(opaque, table=str(self.table))
        return None if not filters else spark_or(filters)


def _or_text(filters: tuple[RowFilter, ...] | None) -> str | None:
    return None if not filters else " OR ".join(f"({f.sql})" for f in filters)


@dataclass(frozen=True)
class SubscriptionFilters:
    """Everything the subscription's publications say, per subscribed table."""

    publications: tuple[str, ...]
    tables: dict[TableName, TableFilters] = field(default_factory=dict)
    #: Tables published but refused, with the reason (only with ``skip_invalid``; not in ``tables``).
    refused: dict[TableName, str] = field(default_factory=dict)


def subscription_filters(
    publications: PublicationSet,
    names: Iterable[str],
    catalog: PublisherCatalog,
    *,
    checked_actions: Iterable[PublishAction] = (PublishAction.UPDATE, PublishAction.DELETE),
    skip_invalid: bool = False,
    publisher_evaluates: bool = False,
) -> SubscriptionFilters:
    """Resolve the effective filters of a subscription to publications ``names``; raise what PostgreSQL would.

    ``checked_actions`` are the operations whose replica-identity rules (which PostgreSQL applies
    when a table is updated or deleted from) are enforced up front. With ``skip_invalid`` (the spec's
    ``on_invalid_table: skip``) a table whose filter, column lists or replica identity is refused is
    left out of ``tables`` and put in ``refused`` with the reason, instead of refusing the subscription.
    With ``publisher_evaluates``
    (the publisher's own catalog, ``filtering: source``) a filter Spark cannot evaluate exactly is kept
    for the publisher to evaluate (core/filters/row_filter.py ``evaluated_by_publisher``), not refused.
    """
    checked = tuple(checked_actions)
    names = tuple(names)
    validated = _Validated(catalog, publisher_evaluates)
    missing = [n for n in names if n not in publications]
    if missing:
        raise PublicationError(f'publication "{missing[0]}" does not exist',
                               publication=missing[0], hint="create it on the publisher or in the publications file, "
                               "or remove it from the spec's publications list")
    pubs = [publications[n] for n in names]
    per_leaf = [_leaf_entry(rel, pubs, catalog) for rel in catalog.all_publishable()
                if rel.relkind is RelKind.TABLE]
    per_leaf = [e for e in per_leaf if e is not None]
    refused: dict[TableName, RowFilterError] = {}
    for leaf, publish_as, _, publishing in per_leaf:
        try:
            _check_replica_identity(leaf, publishing, catalog, checked, validated)
        except RowFilterError as e:
            if not skip_invalid:
                raise
            refused.setdefault(publish_as.name, e)

    grouped: dict[TableName, list[tuple[Relation, Relation, list[Publication], list[Publication]]]] = {}
    for entry in per_leaf:
        grouped.setdefault(entry[1].name, []).append(entry)
    result = SubscriptionFilters(publications=names)
    for table in sorted(grouped):
        if table in refused:
            continue
        try:
            result.tables[table] = _table_filters(table, grouped[table], validated)
        except RowFilterError as e:
            if not skip_invalid:
                raise
            refused[table] = e
    result.refused.update({t: str(e) for t, e in sorted(refused.items())})
    return result


def _table_filters(table: TableName, entries: list, validated: _Validated) -> TableFilters:
    """What the subscription receives of one publish-as table (its leaves' ``entries``)."""
    publish_as = entries[0][1]
    rel_pubs = entries[0][2]
    actions = frozenset(a for _, _, _, publishing in entries for p in publishing for a in p.actions)
    filters = _action_filters(publish_as, rel_pubs, validated)
    return TableFilters(
        table=table,
        leaves=tuple(sorted(e[0].name for e in entries)),
        actions=actions,
        filters={a: filters.get(a) for a in actions if a in DML_ACTIONS},  # no filter for an action not published
        copy_filters=_copy_filters(publish_as, rel_pubs, validated),
        columns=_column_list(publish_as, rel_pubs),
        publications=tuple(p.name for p in rel_pubs),
        copy_only=publish_as.relkind is RelKind.TABLE,
    )


def _publishes(pub: Publication, rel: Relation) -> bool:
    """Does ``pub`` publish ``rel`` itself: FOR ALL TABLES (less its EXCEPT list, 19), its schema, or the table
    (``get_rel_sync_entry``)."""
    return _covers_all(pub, rel) or pub.table_entry(rel.name) is not None or rel.name.schema in pub.schemas


def _covers_all(pub: Publication, rel: Relation) -> bool:
    """FOR ALL TABLES publishes ``rel``: PostgreSQL 19 judges a partition's exclusion at the top-most table of its
    tree (pg_publication.c ``is_table_publishable_in_publication``), where alone EXCEPT may name it."""
    return pub.covers_all(rel.name, rel.ancestors[-1] if rel.is_partition and rel.ancestors else None)


def _leaf_entry(rel: Relation, pubs: list[Publication], catalog: PublisherCatalog):
    """One regular table: its publish-as relation and the publications at that level (``get_rel_sync_entry``,
    pg_publication.c ``GetTopMostAncestorInPublication``)."""
    levels: list[tuple[int, Relation, Publication]] = []
    publishing: list[Publication] = []
    for pub in pubs:
        ancestors = [catalog.relation(a) for a in rel.ancestors]
        published_ancestors = [(i + 1, a) for i, a in enumerate(ancestors) if _publishes(pub, a)]
        if not (_publishes(pub, rel) or published_ancestors):
            continue
        publishing.append(pub)
        if _covers_all(pub, rel) and pub.via_root and rel.is_partition:
            levels.append((len(ancestors), ancestors[-1], pub))
        elif rel.is_partition and pub.via_root and published_ancestors:
            level, ancestor = published_ancestors[-1]  # topmost ancestor published by this pub
            levels.append((level, ancestor, pub))
        else:
            levels.append((0, rel, pub))
    if not levels:
        return None
    top = max(level for level, _, _ in levels)
    publish_as = next(r for level, r, _ in levels if level == top)
    return rel, publish_as, [p for level, _, p in levels if level == top], publishing


def _no_filter(pub: Publication, publish_as: Relation) -> bool:
    """FOR ALL TABLES, a schema covering the table, or no WHERE means no filter (``pgoutput_row_filter_init``)."""
    if pub.all_tables or publish_as.name.schema in pub.schemas:
        return True
    entry = pub.table_entry(publish_as.name)
    return entry is None or entry.row_filter is None


class _Validated:
    """Each publication's filter of a table, parsed and validated once (or as the publications file did).

    A filter is validated when first needed, as PostgreSQL checks it when it is used, so the first
    error the subscription meets stays the one PostgreSQL would raise first.
    """

    def __init__(self, catalog: PublisherCatalog, publisher_evaluates: bool = False) -> None:
        self.catalog = catalog
        self.publisher_evaluates = publisher_evaluates
        self.done: dict[tuple[str, TableName], RowFilter] = {}

    def __call__(self, pub: Publication, rel: Relation) -> RowFilter:
        key = (pub.name, rel.name)
        if key not in self.done:
            entry = pub.table_entry(rel.name)
            assert entry is not None and entry.row_filter is not None
            if entry.refusal is not None:  # refused by the publications file, raised for this table alone
                raise entry.refusal
            if entry.filter is not None and entry.filter.relation == rel:
                self.done[key] = entry.filter
            else:
                try:
                    self.done[key] = validate_row_filter(entry.row_filter, rel, self.catalog.filter_context)
                except UntranslatableFilterError as e:
                    if not self.publisher_evaluates:
                        raise e.with_context(publication=pub.name, table=str(rel.name)) from None
                    self.done[key] = evaluated_by_publisher(entry.row_filter, rel, e.message)
                except RowFilterError as e:
                    raise e.with_context(publication=pub.name, table=str(rel.name)) from None
        return self.done[key]


def _action_filters(publish_as: Relation, pubs: list[Publication], validated: _Validated):
    """Per action, no filter if a publication publishing it has none, else the OR (``pgoutput_row_filter_init``)."""
    no_filter: set[PublishAction] = set()
    collected: dict[PublishAction, list[RowFilter]] = {}
    for pub in pubs:
        unfiltered = _no_filter(pub, publish_as)
        row_filter = None if unfiltered else validated(pub, publish_as)
        for action in DML_ACTIONS:
            if not pub.publishes(action):
                continue
            if row_filter is None:  # unfiltered
                no_filter.add(action)
            else:
                collected.setdefault(action, []).append(row_filter)
    result: dict[PublishAction, tuple[RowFilter, ...] | None] = {}
    for action in DML_ACTIONS:
        if action in no_filter:
            result[action] = None
        elif action in collected:
            result[action] = _dedupe(collected[action])
    return result


def _dedupe(filters: list[RowFilter]) -> tuple[RowFilter, ...]:
    seen: dict[str, RowFilter] = {}
    for f in filters:
        seen.setdefault(f.sql, f)
    return tuple(seen.values())


def _copy_filters(publish_as: Relation, pubs: list[Publication], validated: _Validated):
    """OR of every publication's filter regardless of ``publish``; any unfiltered one wins.

    tablesync.c ``fetch_remote_table_info``.
    """
    filters: list[RowFilter] = []
    for pub in pubs:
        if _no_filter(pub, publish_as):
            return None
        filters.append(validated(pub, publish_as))
    return _dedupe(filters)


def _column_list(publish_as: Relation, pubs: list[Publication]) -> tuple[str, ...] | None:
    """Every publication must give the same column set; a full list equals none (``pgoutput_column_list_init``).

    A publication without a column list gives every column but the generated ones, and from PostgreSQL 18 the
    stored generated ones too under ``publish_generated_columns = stored`` (pgoutput.c ``check_and_init_gencol``,
    which refuses publications without a list that differ in that setting). None stands for the columns that are
    not generated: a list naming a generated column is returned whole.
    """
    all_columns = tuple(c.name for c in publish_as.columns if not c.generated)
    with_stored = tuple(c.name for c in publish_as.columns if c.generated in ("", "s"))
    chosen: set[frozenset[str]] = set()
    gencols: set[str] = set()
    for pub in pubs:
        entry = None if (pub.all_tables or publish_as.name.schema in pub.schemas) else pub.table_entry(publish_as.name)
        if entry is not None and entry.columns is not None:
            cols = entry.columns
        else:
            gencols.add(pub.publish_generated_columns)
            cols = with_stored if pub.publish_generated_columns == "stored" else all_columns
        chosen.add(frozenset(cols))
    if len(gencols) > 1 and with_stored != all_columns:
        raise ColumnListConflictError(
            f'cannot use different values of publish_generated_columns for table "{publish_as.name}" in different '
            "publications", table=str(publish_as.name),
            hint="give every publication of the subscription that publishes the table without a column list the same "
            "publish_generated_columns, or subscribe to them separately")
    if len(chosen) > 1:
        raise ColumnListConflictError(
            f'cannot use different column lists for table "{publish_as.name}" in different publications',
            table=str(publish_as.name),
            hint="give the table the same column list in every publication of the subscription, "
            "or subscribe to the publications separately")
    (only,) = chosen
    if only == frozenset(all_columns):
        return None
    return tuple(c.name for c in publish_as.columns if c.name in only)


def _check_replica_identity(
    leaf: Relation, pubs: list[Publication], catalog: PublisherCatalog, checked: tuple[PublishAction, ...],
    validated: _Validated,
) -> None:
    """R10: what PostgreSQL checks when the table is UPDATEd or DELETEd (CheckCmdReplicaIdentity)."""
    for action, verb in ((PublishAction.UPDATE, "update"), (PublishAction.DELETE, "delete from")):
        if action not in checked:
            continue
        publishing = [p for p in pubs if p.publishes(action)]
        if not publishing:
            continue
        key = leaf.replica_identity_key
        for pub in publishing:
            if pub.all_tables:
                continue
            target = leaf
            if pub.via_root:
                published = [catalog.relation(a) for a in leaf.ancestors if _publishes(pub, catalog.relation(a))]
                if published:
                    target = published[-1]
            if target.name.schema in pub.schemas:
                continue
            entry = pub.table_entry(target.name)
            if entry is None:
                _check_generated_identity(leaf, pub, None, verb)
                continue
            if entry.row_filter is not None and key is not None:
                used = validated(pub, target).columns
                if not used <= key:
                    raise _identity_error(
                        verb, leaf, pub,
                        "Column used in the publication WHERE expression is not part of the replica identity.",
                        f"filter only on replica identity columns {sorted(key)} for publications that publish "
                        f"{action.value}, or set REPLICA IDENTITY FULL on the publisher (ALTER TABLE {leaf.name} "
                        "REPLICA IDENTITY FULL)")
            if entry.columns is not None and (key is None or not key <= set(entry.columns)):
                raise _identity_error(
                    verb, leaf, pub, "Column list used by the publication does not cover the replica identity.",
                    "include every replica identity column in the column list (REPLICA IDENTITY FULL "
                    "admits no column list)")
            _check_generated_identity(leaf, pub, entry, verb)
        if not leaf.has_replica_identity:
            raise ReplicaIdentityError(
                f'cannot {verb} table "{leaf.name.name}" because it does not have a replica identity and '
                f'publishes {action.value}s',
                hint=f"To enable {'updating' if action is PublishAction.UPDATE else 'deleting from'} the table, "
                "set REPLICA IDENTITY using ALTER TABLE.",
                table=str(leaf.name), publication=publishing[0].name)


def _identity_error(verb: str, leaf: Relation, pub: Publication, detail: str, hint: str) -> ReplicaIdentityError:
    """PostgreSQL's ``cannot update table "t"`` / ``cannot delete from table "t"`` with its DETAIL, and our fix."""
    return ReplicaIdentityError(f'cannot {verb} table "{leaf.name.name}"', detail=detail, publication=pub.name,
                                table=str(leaf.name), hint=hint)


def _check_generated_identity(leaf: Relation, pub: Publication, entry, verb: str) -> None:
    """PostgreSQL 18: the replica identity may not hold a generated column the publication leaves out
    (publicationcmds.c ``pub_contains_invalid_column``; raised by execReplication.c
    ``CheckCmdReplicaIdentity``)."""
    generated = {c.name: c.generated for c in leaf.columns if c.generated}
    if not generated:
        return
    if entry is not None and entry.columns is not None:
        published = set(entry.columns)
    else:
        published = {n for n, kind in generated.items() if kind == "s" and pub.publish_generated_columns == "stored"}
    key = leaf.replica_identity_key
    identity = set(generated) if key is None else set(key) & set(generated)
    if any(generated[c] == "v" or c not in published for c in identity):
        raise _identity_error(
            verb, leaf, pub, "Replica identity must not contain unpublished generated columns.",
            "publish the generated columns (publish_generated_columns = stored, or name them in the column "
            "list), or choose a replica identity without them")


def _table_list(pubs: list[Publication], catalog: PublisherCatalog) -> list[TableName]:
    """The tables a subscriber lists, roots when published via root, else leaves (pg_publication.c
    ``pg_get_publication_tables``)."""
    names: list[TableName] = []
    for pub in pubs:
        candidates: list[Relation] = []
        if pub.all_tables:  # GetAllPublicationRelations: the EXCEPT list (19) left out
            candidates = [r for r in catalog.all_publishable()
                          if ((r.relkind is RelKind.TABLE and not (pub.via_root and r.is_partition))
                              or (pub.via_root and r.is_partitioned and not r.is_partition)) and _covers_all(pub, r)]
        else:
            explicit = [catalog.relation(e.table) for e in pub.tables]
            for schema in pub.schemas:
                explicit += catalog.tables_in_schema(schema)
            for rel in explicit:
                if rel.is_partitioned and not pub.via_root:
                    candidates += [catalog.relation(p) for p in rel.partitions]
                else:
                    candidates.append(rel)
        names += [r.name for r in candidates if publishable(r)]
    unique = sorted(set(names))
    if any(p.via_root for p in pubs):
        unique = [n for n in unique if not set(catalog.relation(n).ancestors) & set(unique)]
    return unique


def subscribed_tables(publications: PublicationSet, names: Iterable[str], catalog: PublisherCatalog) -> list[TableName]:
    """The subscription's table list, as ``pg_subscription_rel`` would hold it."""
    return _table_list([publications[n] for n in names], catalog)


def filters_document(filters: SubscriptionFilters, subscription: str, *, with_trees: bool = False,
                     untranslatable_ok: bool = False) -> dict:
    """The effective filters as a JSON-ready document.

    With ``with_trees`` it is what a refresh records in ``rowfilter.refresh_history`` for the apply:
    ``spark_filter_trees`` holds each action's Spark expression tree itself (``sqlglot.serde``), which
    the apply loads and evaluates (docs/adr/row-filter-across-processes.md); ``spark_filters`` is the
    same tree as Spark SQL text, for people (and the apply of documents recorded before the trees).

    With ``untranslatable_ok`` (definitions the publisher evaluates itself, ``filtering: source``) a
    table whose filters Spark cannot evaluate exactly is recorded without Spark filters, its reason in
    ``spark_untranslatable``: an apply that would have to judge it in Spark refuses it then.
    """
    tables = []
    for name, t in filters.tables.items():
        try:
            spark = {a: t.spark_filter(a) for a in DML_ACTIONS if a in t.actions}
            untranslatable = None
        except UntranslatableFilterError as e:
            if not untranslatable_ok:
                raise
            spark, untranslatable = {}, str(e)
        tables.append({
            "table": str(name),
            "leaves": [str(leaf) for leaf in t.leaves],
            "publications": list(t.publications),
            "actions": sorted(a.value for a in t.actions),
            "filters": {a.value: t.filter_sql(a) for a in DML_ACTIONS if a in t.actions},
            "spark_filters": {a.value: _maybe(to_spark_text, spark[a]) for a in spark},
            "copy_filter": t.copy_filter_sql,
            "columns": list(t.columns) if t.columns is not None else None,
            # What the apply job casts each value the Spark filters read to (format_type() text), and how it reads
            # a numeric (core/filters/spark_sql.py NUMERIC_READS)
            "filter_column_types": _filter_column_types(t),
            "numeric_reads": NUMERIC_READS,
        })
        if with_trees:
            tables[-1]["spark_filter_trees"] = {a.value: _maybe(serde.dump, spark[a]) for a in spark}
        if untranslatable is not None:
            tables[-1]["spark_untranslatable"] = untranslatable
    return {"subscription": subscription, "publications": list(filters.publications), "tables": tables}


def _maybe(render, tree: exp.Expr | None):
    return None if tree is None else render(tree)


def _filter_column_types(t: TableFilters) -> dict[str, str]:
    """The publisher type of every column an action's filter reads, by column name."""
    types: dict[str, str] = {}
    for filters in t.filters.values():
        for f in filters or ():
            by_name = {c.name: c.type_name for c in f.relation.columns}
            types.update({name: by_name[name] for name in sorted(f.columns)})
    return dict(sorted(types.items()))


def leaf_actions(filters: SubscriptionFilters, publications: PublicationSet,
                 catalog: PublisherCatalog) -> dict[TableName, frozenset[PublishAction]]:
    """The actions the subscription's publications publish for each subscribed leaf.

    pgoutput's ``get_rel_sync_entry`` ORs the actions of every publication that publishes the leaf
    itself or one of its ancestors (whatever ``publish_via_partition_root``), per leaf: two
    partitions of one root can differ.
    """
    pubs = [publications[n] for n in filters.publications]
    result: dict[TableName, frozenset[PublishAction]] = {}
    for table in filters.tables.values():
        for leaf in table.leaves:
            chain = [catalog.relation(leaf)]
            chain += [catalog.relation(a) for a in chain[0].ancestors]
            result[leaf] = frozenset(a for p in pubs if any(_publishes(p, r) for r in chain) for a in p.actions)
    return result


def leaf_capture_columns(filters: SubscriptionFilters, catalog: PublisherCatalog) -> dict[TableName, tuple[str, ...]]:
    """The column list a capture publication (``filtering: spark``) gives a leaf whose published columns include a
    generated one (PostgreSQL 18): every column that is not generated, and the published generated ones. pgoutput
    sends a generated column only when a column list names it or ``publish_generated_columns = stored``
    (``check_and_init_gencol``); the capture publications are shared by every table, so the list is per leaf.
    Leaves that publish no generated column get none (every column that is not generated, as before)."""
    result: dict[TableName, tuple[str, ...]] = {}
    for table in filters.tables.values():
        if table.columns is None:
            continue
        for leaf in table.leaves:
            columns = catalog.relation(leaf).columns
            if any(c.generated and c.name in table.columns for c in columns):
                result[leaf] = tuple(c.name for c in columns if not c.generated or c.name in table.columns)
    return result
