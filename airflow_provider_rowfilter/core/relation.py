"""What the publisher knows about a table: columns, types, replica identity, partitioning."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.names import quote_identifier, split_names

# PostgreSQL's FirstNormalObjectId: objects with a lower OID are built in.
FIRST_NORMAL_OBJECT_ID = 16384

SYSTEM_COLUMNS = frozenset({"tableoid", "cmax", "xmax", "cmin", "xmin", "ctid"})


@dataclass(frozen=True, order=True)
class TableName:
    """A schema-qualified table name."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str, default_schema: str = "public") -> TableName:
        """Parse ``schema.table`` or ``table`` (no quoting rules beyond a single dot)."""
        schema, _, name = text.rpartition(".")
        return cls(schema or default_schema, name)

    @classmethod
    def from_sql(cls, text: str, what: str = "table", default_schema: str = "public") -> TableName:
        """A table name the user wrote (``--table``, ``tables=``), read as PostgreSQL reads SQL
        (core/names.py): ``Sales.Orders`` is ``sales.orders``, ``"Sales"."Orders"`` keeps its case."""
        try:
            names = split_names(text, what)
        except SpecError as e:
            raise SpecError(f"{what}: {text!r} is not a table name", hint=e.hint) from None
        if len(names) > 2:
            raise SpecError(f"{what}: {text!r} is not a table name",
                            hint="write schema.table, e.g. public.t1 (or t1 for public.t1)")
        return cls(default_schema, names[0]) if len(names) == 1 else cls(*names)

    def as_sql(self) -> str:
        """The name as the user writes it (``--table``): what :meth:`from_sql` reads back unchanged."""
        return f"{quote_identifier(self.schema)}.{quote_identifier(self.name)}"

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


def table_names(value: Sequence[str] | str | None, setting: str = "tables") -> list[TableName]:
    """Table names given as a list or a comma-separated string (what Jinja renders), sorted, each once.

    ``schema.table``, or ``table`` for ``public.table``, read as SQL names (:meth:`TableName.from_sql`:
    unquoted folds to lower case); blanks between commas are skipped. None or nothing gives an empty
    list (the caller's "all of the subscription's tables").

    :raises SpecError: naming ``setting``, for a value that is not a list of names or a name that is
        not ``schema.table``.
    """
    if value is None:
        return []
    items = [v for v in (p.strip() for p in value.split(",")) if v] if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(isinstance(v, str) and v.strip() for v in items):
        raise SpecError(f"{setting}={value!r} is not a list of table names",
                        hint=f"pass {setting}=['public.t1', 'sales.orders'] or 'public.t1,sales.orders'")
    names = set()
    for text in items:
        names.add(TableName.from_sql(text.strip(), setting))
    return sorted(names)


class ReplicaIdentity(str, enum.Enum):
    """``pg_class.relreplident``."""

    DEFAULT = "d"
    NOTHING = "n"
    FULL = "f"
    INDEX = "i"


class RelKind(str, enum.Enum):
    """``pg_class.relkind`` values that matter to publications."""

    TABLE = "r"
    PARTITIONED = "p"
    VIEW = "v"
    MATERIALIZED_VIEW = "m"
    FOREIGN = "f"
    SEQUENCE = "S"


@dataclass(frozen=True)
class Column:
    """One live (not dropped) column of a publisher table."""

    name: str
    attnum: int
    type_name: str  # format_type() text, e.g. "integer", "numeric(10,2)", "character varying(20)"
    type_oid: int
    collation: str | None = None  # collation name when the column's type is collatable
    collation_oid: int = 0
    not_null: bool = False
    generated: str = ""  # "" none, "s" stored, "v" virtual (pg_attribute.attgenerated)

    @property
    def user_defined_type(self) -> bool:
        return self.type_oid >= FIRST_NORMAL_OBJECT_ID


@dataclass(frozen=True)
class Relation:
    """A publisher table as the publication rules need it."""

    name: TableName
    oid: int
    relkind: RelKind
    columns: tuple[Column, ...]
    replica_identity: ReplicaIdentity = ReplicaIdentity.DEFAULT
    identity_columns: tuple[str, ...] = ()  # the key: PK for DEFAULT, index columns for INDEX
    persistence: str = "p"  # p permanent, u unlogged, t temp
    is_partition: bool = False
    ancestors: tuple[TableName, ...] = ()  # nearest parent first (partition ancestors only)
    inheritance_children: tuple[TableName, ...] = ()  # direct and indirect, non-partition inheritance
    partitions: tuple[TableName, ...] = field(default=())  # leaf partitions (partitioned tables only)

    def column(self, name: str) -> Column | None:
        for col in self.columns:
            if col.name == name:
                return col
        return None

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def is_partitioned(self) -> bool:
        return self.relkind is RelKind.PARTITIONED

    @property
    def replica_identity_key(self) -> frozenset[str] | None:
        """Columns an UPDATE/DELETE filter may use; ``None`` means every column (REPLICA IDENTITY FULL)."""
        if self.replica_identity is ReplicaIdentity.FULL:
            return None
        if self.replica_identity is ReplicaIdentity.NOTHING:
            return frozenset()
        return frozenset(self.identity_columns)

    @property
    def has_replica_identity(self) -> bool:
        return self.replica_identity is ReplicaIdentity.FULL or bool(self.identity_columns)
