"""Publications as PostgreSQL stores them: ``pg_publication``, ``pg_publication_rel``, ``pg_publication_namespace``."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_provider_rowfilter.core.relation import TableName

if TYPE_CHECKING:
    from airflow_provider_rowfilter.core.errors import RowFilterError
    from airflow_provider_rowfilter.core.filters.row_filter import RowFilter


class PublishAction(str, enum.Enum):
    """A DML action a publication may publish (``WITH (publish = '…')``)."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    TRUNCATE = "truncate"


ALL_ACTIONS = frozenset(PublishAction)
DML_ACTIONS = (PublishAction.INSERT, PublishAction.UPDATE, PublishAction.DELETE)


@dataclass(frozen=True)
class PublishedTable:
    """One ``pg_publication_rel`` row: a table, its row filter and its column list.

    ``row_filter`` is the WHERE expression in PostgreSQL syntax without the outer parentheses;
    ``filter`` the same expression parsed and validated against the table (set where it was checked:
    a publications file; a publisher's publications are checked when a subscription first needs
    them); ``columns`` is ``None`` when the publication has no column list for the table.
    """

    table: TableName
    row_filter: str | None = None
    columns: tuple[str, ...] | None = None
    filter: RowFilter | None = field(default=None, compare=False, repr=False)
    #: Why the file's filter was refused, kept for the subscription to raise for this table alone
    #: (``on_invalid_table: skip``; core/publication/ddl.py, ``table_refusals``).
    refusal: RowFilterError | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Publication:
    """A publication: which tables, which rows and columns, which actions."""

    name: str
    all_tables: bool = False
    tables: tuple[PublishedTable, ...] = ()
    schemas: tuple[str, ...] = ()
    actions: frozenset[PublishAction] = ALL_ACTIONS
    via_root: bool = False
    publish_generated_columns: str = "none"  # PostgreSQL 18: "none" or "stored"
    #: PostgreSQL 19: ``FOR ALL TABLES EXCEPT (TABLE …)``: the tables (roots of partitioned ones, inheritance children
    #: as listed) a FOR ALL TABLES publication leaves out (``pg_publication_rel.prexcept``)
    except_tables: tuple[TableName, ...] = ()
    #: PostgreSQL 19: ``FOR ALL SEQUENCES`` (``pg_publication.puballsequences``)
    all_sequences: bool = False

    def table_entry(self, table: TableName) -> PublishedTable | None:
        for entry in self.tables:
            if entry.table == table:
                return entry
        return None

    def covers_all(self, rel_name: TableName, root: TableName | None = None) -> bool:
        """FOR ALL TABLES publishes this table: not in the EXCEPT list, judged at the partition tree's top-most
        table (``root``) for a partition (pg_publication.c ``is_table_publishable_in_publication``)."""
        return self.all_tables and (root or rel_name) not in self.except_tables

    def publishes(self, action: PublishAction) -> bool:
        return action in self.actions

    def with_changes(self, **changes: Any) -> Publication:
        return replace(self, **changes)


@dataclass
class PublicationSet:
    """The publications a definition source yields, by name, in definition order."""

    publications: dict[str, Publication] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Publication:
        return self.publications[name]

    def __contains__(self, name: object) -> bool:
        return name in self.publications

    def __iter__(self):
        return iter(self.publications.values())

    def __len__(self) -> int:
        return len(self.publications)

    def names(self) -> list[str]:
        return list(self.publications)
