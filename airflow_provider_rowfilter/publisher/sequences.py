"""The sequences a table owns (``serial``, ``GENERATED … AS IDENTITY``) and their values: read on either side.

Logical replication does not replicate sequences (the Restrictions of PostgreSQL's logical
replication chapter): a failover or a switchover to the subscriber needs the subscriber's sequences
moved past the publisher's (flows/sync_sequences.py). A table owns a sequence through ``pg_depend``
(``deptype`` ``a`` for ``serial``'s OWNED BY, ``i`` for an identity column: what
``pg_get_serial_sequence`` follows); ``pg_sequences.last_value`` is the last value handed out, NULL
when the sequence was never used (or the role may not read it: ``has_sequence_privilege``). The
query is the same on the publisher and on the subscriber, so it lives here once; the subscriber's
``setval`` is in subscriber/sequences.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from airflow_provider_rowfilter.core.relation import TableName


@dataclass(frozen=True)
class OwnedSequence:
    """A sequence owned by a column of a table, and where it stands."""

    table: TableName
    column: str
    sequence: str  # schema-qualified, each part quoted as SQL needs
    increment: int
    start: int
    min_value: int
    max_value: int
    last_value: int | None  # None: never used (nextval never called), or not readable (``readable`` False)
    readable: bool

    @property
    def next_value(self) -> int:
        """What ``nextval`` returns next (before any other session's)."""
        return self.start if self.last_value is None else self.last_value + self.increment


_OWNED = """
SELECT n.nspname, c.relname, a.attname, quote_ident(sn.nspname) || '.' || quote_ident(s.relname),
       q.seqincrement, q.seqstart, q.seqmin, q.seqmax,
       CASE WHEN has_sequence_privilege(s.oid, 'SELECT,USAGE') THEN ps.last_value END,
       has_sequence_privilege(s.oid, 'SELECT,USAGE')
FROM unnest(%s::text[], %s::text[]) AS t(schema_name, table_name)
JOIN pg_namespace n ON n.nspname = t.schema_name
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.table_name
JOIN pg_depend d ON d.refclassid = 'pg_class'::regclass AND d.refobjid = c.oid AND d.classid = 'pg_class'::regclass
                 AND d.deptype IN ('a', 'i')
JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
JOIN pg_namespace sn ON sn.oid = s.relnamespace
JOIN pg_sequence q ON q.seqrelid = s.oid
JOIN pg_sequences ps ON ps.schemaname = sn.nspname AND ps.sequencename = s.relname
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.refobjsubid
ORDER BY 1, 2, 3
"""


def owned_sequences(conn: psycopg.Connection, tables: Sequence[TableName]) -> dict[tuple[TableName, str], OwnedSequence]:
    """The sequences the columns of ``tables`` own, by (table, column)."""
    rows = conn.execute(_OWNED, ([t.schema for t in tables], [t.name for t in tables])).fetchall()
    found = {}
    for schema, table, column, sequence, increment, start, low, high, last, readable in rows:
        owned = OwnedSequence(TableName(schema, table), column, sequence, increment, start, low, high, last, readable)
        found[owned.table, column] = owned
    return found


#: PostgreSQL 19's ``FOR ALL SEQUENCES`` publications: ``pg_publication.puballsequences`` and the view
#: ``pg_publication_sequences`` (system_views.sql) of what they publish.
ALL_SEQUENCES_VERSION = 190000

# What GetAllPublicationRelations(RELKIND_SEQUENCE) lists (pg_publication.c is_publishable_class): every permanent
# sequence that is no system object; for a publications file's FOR ALL SEQUENCES, read on a publisher of any version.
_PUBLISHABLE = """
SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'S' AND c.relpersistence = 'p' AND c.oid >= 16384
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2
"""

_NAMED = """
SELECT sn.nspname, s.relname, quote_ident(sn.nspname) || '.' || quote_ident(s.relname),
       q.seqincrement, q.seqstart, q.seqmin, q.seqmax,
       CASE WHEN has_sequence_privilege(s.oid, 'SELECT,USAGE') THEN ps.last_value END,
       has_sequence_privilege(s.oid, 'SELECT,USAGE'), tn.nspname, t.relname, a.attname
FROM unnest(%s::text[], %s::text[]) AS w(schema_name, sequence_name)
JOIN pg_namespace sn ON sn.nspname = w.schema_name
JOIN pg_class s ON s.relnamespace = sn.oid AND s.relname = w.sequence_name AND s.relkind = 'S'
JOIN pg_sequence q ON q.seqrelid = s.oid
JOIN pg_sequences ps ON ps.schemaname = sn.nspname AND ps.sequencename = s.relname
LEFT JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid AND d.refclassid = 'pg_class'::regclass
                      AND d.deptype IN ('a', 'i')
LEFT JOIN pg_class t ON t.oid = d.refobjid
LEFT JOIN pg_namespace tn ON tn.oid = t.relnamespace
LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid
ORDER BY 1, 2
"""


def all_sequences_published(conn: psycopg.Connection, publications: Sequence[str]) -> list[TableName] | None:
    """The sequences the publisher's catalog publishes to ``publications`` (PostgreSQL 19: ``pg_publication_sequences``
    of a ``FOR ALL SEQUENCES`` publication), by name; None before 19, or when none of them is FOR ALL SEQUENCES."""
    if conn.info.server_version < ALL_SEQUENCES_VERSION:
        return None
    if not conn.execute("SELECT coalesce(bool_or(puballsequences), false) FROM pg_publication WHERE pubname = ANY(%s)",
                        (list(publications),)).fetchone()[0]:
        return None
    return [TableName(*r) for r in conn.execute(
        "SELECT DISTINCT schemaname::text, sequencename::text FROM pg_publication_sequences WHERE pubname = ANY(%s) "
        "ORDER BY 1, 2", (list(publications),))]


def publishable_sequences(conn: psycopg.Connection) -> list[TableName]:
    """Every sequence a ``FOR ALL SEQUENCES`` publication publishes, as PostgreSQL 19 lists them."""
    return [TableName(*r) for r in conn.execute(_PUBLISHABLE)]


def named_sequences(conn: psycopg.Connection, names: Sequence[TableName]) -> dict[TableName, OwnedSequence]:
    """The sequences ``names`` (schema, sequence) where they exist, with the column that owns each, if one does (its
    ``table`` is then the owner, else the sequence's own name, and ``column`` is empty)."""
    rows = conn.execute(_NAMED, ([n.schema for n in names], [n.name for n in names])).fetchall()
    found = {}
    for schema, name, sequence, increment, start, low, high, last, readable, tschema, table, column in rows:
        owner = TableName(tschema, table) if table is not None else TableName(schema, name)
        found[TableName(schema, name)] = OwnedSequence(owner, column or "", sequence, increment, start, low, high,
                                                       last, readable)
    return found
