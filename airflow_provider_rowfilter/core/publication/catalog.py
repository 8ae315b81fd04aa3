"""The publisher's catalog as the rules consult it: tables, schemas and settings (publisher/catalog_reader.py reads it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_provider_rowfilter.core.filters.analysis import FilterContext
from airflow_provider_rowfilter.core.relation import Relation, RelKind, TableName

SYSTEM_SCHEMAS = frozenset({"pg_catalog", "information_schema", "pg_toast"})


@dataclass(frozen=True)
class PublisherCatalog:
    """Tables (with columns, replica identity and partitioning) and schemas of the publisher."""

    relations: Mapping[TableName, Relation]
    schemas: frozenset[str] = frozenset({"public"})
    server_version_num: int = 180000
    search_path: tuple[str, ...] = ("public",)
    filter_context: FilterContext = field(default_factory=FilterContext)

    def resolve(self, schema: str | None, name: str) -> Relation | None:
        """Find a table as PostgreSQL's name lookup would (search_path for unqualified names)."""
        if schema:
            return self.relations.get(TableName(schema, name))
        # pg_catalog is searched first unless search_path names it elsewhere (namespace.c)
        path = self.search_path if "pg_catalog" in self.search_path else ("pg_catalog", *self.search_path)
        for candidate in path:
            rel = self.relations.get(TableName(candidate, name))
            if rel is not None:
                return rel
        return None

    def relation(self, name: TableName) -> Relation:
        return self.relations[name]

    def tables_in_schema(self, schema: str) -> list[Relation]:
        """Publishable tables of a schema (relkind r or p, permanent), in name order."""
        return [r for n, r in sorted(self.relations.items()) if n.schema == schema and publishable(r)]

    def all_publishable(self) -> list[Relation]:
        return [r for _, r in sorted(self.relations.items()) if publishable(r)]


def publishable(rel: Relation) -> bool:
    """pg_publication.c ``is_publishable_class``: regular or partitioned, permanent, not a system table."""
    return (
        rel.relkind in (RelKind.TABLE, RelKind.PARTITIONED)
        and rel.persistence == "p"
        and rel.name.schema not in SYSTEM_SCHEMAS
    )
