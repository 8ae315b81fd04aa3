"""Read the publisher's catalog over psycopg into core's models: tables, partitions, replica identity
(:class:`~airflow_provider_rowfilter.core.publication.catalog.PublisherCatalog`) and publications."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg

from airflow_provider_rowfilter.core.errors import CatalogError
from airflow_provider_rowfilter.core.filters.analysis import FilterContext
from airflow_provider_rowfilter.core.filters.functions import FunctionCatalog
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.publication.catalog import PublisherCatalog
from airflow_provider_rowfilter.core.publication.model import (
    Publication,
    PublicationSet,
    PublishAction,
    PublishedTable,
)
from airflow_provider_rowfilter.core.relation import (
    FIRST_NORMAL_OBJECT_ID,
    Column,
    Relation,
    RelKind,
    ReplicaIdentity,
    TableName,
)
from airflow_provider_rowfilter.publisher.catalog_features import refuse_unknown_features
from airflow_provider_rowfilter.publisher.slot_health import WAL_END

log = logging.getLogger(__name__)

#: Where a publications file's unqualified names are looked up (``FOR TABLE t9`` is ``public.t9``, ``FOR TABLES IN
#: SCHEMA CURRENT_SCHEMA`` is ``public``), after pg_catalog (core/publication/catalog.py): PostgreSQL's default search_path
#: without ``"$user"``. Never the session's own path: that is pinned empty (connection.py ``open_session``), and
#: the job role's ``$user`` schema is one a role with CREATE on the database may make and fill with a table
#: of the same name, which would take the name over on the next run.
FILE_SEARCH_PATH = ("public",)

_RELATIONS = """
SELECT c.oid, n.nspname, c.relname, c.relkind, c.relpersistence, c.relreplident, c.relispartition
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
  AND n.nspname NOT LIKE 'pg\\_toast%%' AND n.nspname NOT LIKE 'pg\\_temp%%'
"""
_COLUMNS = """
SELECT a.attrelid, a.attname, a.attnum, format_type(a.atttypid, a.atttypmod), a.atttypid,
       co.collname, a.attcollation, a.attnotnull, {generated}
FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE a.attnum > 0 AND NOT a.attisdropped AND a.attrelid = ANY(%s)
ORDER BY a.attrelid, a.attnum
"""
_IDENTITY = """
SELECT i.indrelid, i.indisprimary, i.indisreplident, array_agg(a.attname ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE ((i.indisprimary AND i.indimmediate) OR i.indisreplident) AND i.indrelid = ANY(%s)
GROUP BY i.indrelid, i.indisprimary, i.indisreplident, i.indexrelid
"""
_INHERITS = "SELECT inhrelid, inhparent FROM pg_inherits"


def read_catalog(conn: psycopg.Connection) -> PublisherCatalog:
    """Read the publisher's tables and settings that the publication rules consult."""
    try:
        return _read_catalog(conn)
    except psycopg.Error as e:
        raise CatalogError(f"could not read the publisher's catalog: {e}",
                           hint="the publisher role needs USAGE on the schemas and SELECT on pg_catalog") from e


def _read_catalog(conn: psycopg.Connection) -> PublisherCatalog:
    with conn.cursor() as cur:
        version = conn.info.server_version
        rows = cur.execute(_RELATIONS).fetchall()
        oids = [r[0] for r in rows]
        generated = "a.attgenerated" if version >= 120000 else "''"
        columns: dict[int, list[Column]] = {}
        for relid, name, attnum, typ, typoid, coll, colloid, notnull, gen in cur.execute(
            _COLUMNS.format(generated=generated), (oids,)
        ):
            columns.setdefault(relid, []).append(
                Column(name, attnum, typ, typoid, coll, colloid, notnull, gen or ""))
        primary: dict[int, tuple[str, ...]] = {}
        replident: dict[int, tuple[str, ...]] = {}
        for relid, is_primary, is_replident, names in cur.execute(_IDENTITY, (oids,)):
            if is_primary:
                primary[relid] = tuple(names)
            if is_replident:
                replident[relid] = tuple(names)
        parents: dict[int, list[int]] = {}
        for child, parent in cur.execute(_INHERITS):
            parents.setdefault(child, []).append(parent)
        schemas = frozenset(r[0] for r in cur.execute("SELECT nspname FROM pg_namespace"))
        default_collation = cur.execute(
            "SELECT datcollate FROM pg_database WHERE datname = current_database()").fetchone()[0]
        timezone = cur.execute("SHOW timezone").fetchone()[0]
        functions = _functions(cur)

    by_oid = {r[0]: r for r in rows}
    names = {oid: TableName(r[1], r[2]) for oid, r in by_oid.items()}
    children: dict[int, list[int]] = {}
    for child, ps in parents.items():
        for p in ps:
            children.setdefault(p, []).append(child)

    def ancestors(oid: int) -> tuple[TableName, ...]:
        chain, current = [], oid
        while by_oid.get(current) and by_oid[current][6] and parents.get(current):
            current = parents[current][0]
            chain.append(names[current])
        return tuple(chain)

    def descendants(oid: int) -> list[int]:
        out: list[int] = []
        for c in children.get(oid, []):
            out.append(c)
            out.extend(descendants(c))
        return out

    relations: dict[TableName, Relation] = {}
    for oid, (_, _, _, relkind, persistence, ident, is_partition) in by_oid.items():
        identity = ReplicaIdentity(ident)
        key = primary.get(oid, ()) if identity is ReplicaIdentity.DEFAULT else (
            replident.get(oid, ()) if identity is ReplicaIdentity.INDEX else ())
        desc = [d for d in descendants(oid) if d in by_oid]
        relations[names[oid]] = Relation(
            name=names[oid], oid=oid, relkind=RelKind(relkind), columns=tuple(columns.get(oid, ())),
            replica_identity=identity, identity_columns=key, persistence=persistence,
            is_partition=bool(is_partition), ancestors=ancestors(oid),
            inheritance_children=tuple(names[d] for d in desc if not by_oid[d][6]),
            partitions=tuple(names[d] for d in desc if by_oid[d][6] and by_oid[d][3] == "r"),
        )
    return PublisherCatalog(
        relations=relations, schemas=schemas, server_version_num=version, search_path=FILE_SEARCH_PATH,
        filter_context=FilterContext(functions=functions, default_collation=default_collation, timezone=timezone),
    )


def _functions(cur: psycopg.Cursor) -> FunctionCatalog:
    procs = cur.execute("SELECT oid, proname, provolatile FROM pg_proc").fetchall()
    operators = cur.execute("SELECT oid, oprname FROM pg_operator").fetchall()
    collations = cur.execute("SELECT oid, collname FROM pg_collation").fetchall()
    builtin = [p for p in procs if p[0] < FIRST_NORMAL_OBJECT_ID]
    return FunctionCatalog(
        builtins=frozenset(p[1] for p in builtin),
        immutable_builtins=frozenset(p[1] for p in builtin if p[2] == "i"),
        user_defined=frozenset(p[1] for p in procs if p[0] >= FIRST_NORMAL_OBJECT_ID),
        builtin_operators=frozenset(o[1] for o in operators if o[0] < FIRST_NORMAL_OBJECT_ID),
        user_defined_operators=frozenset(o[1] for o in operators if o[0] >= FIRST_NORMAL_OBJECT_ID),
        builtin_collations=frozenset(c[1] for c in collations if c[0] < FIRST_NORMAL_OBJECT_ID),
        user_defined_collations=frozenset(c[1] for c in collations if c[0] >= FIRST_NORMAL_OBJECT_ID),
    )


_PUBLICATIONS = """
SELECT p.pubname, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, {viaroot}, {gencols},
       {allseqs}
FROM pg_publication p ORDER BY p.pubname
"""
_PUBLICATION_RELS_15 = """
SELECT p.pubname, n.nspname, c.relname, pg_get_expr(pr.prqual, pr.prrelid),
       (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
         WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs))
FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
"""
_PUBLICATION_RELS_OLD = """
SELECT p.pubname, n.nspname, c.relname, NULL::text, NULL::name[]
FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
"""
_PUBLICATION_SCHEMAS = """
SELECT p.pubname, n.nspname FROM pg_publication_namespace pn
JOIN pg_publication p ON p.oid = pn.pnpubid JOIN pg_namespace n ON n.oid = pn.pnnspid
"""


def read_publications(conn: psycopg.Connection) -> PublicationSet:
    """Read every publication of the publisher (row filters and column lists on PostgreSQL 15+)."""
    version = conn.info.server_version
    result = PublicationSet()
    with conn.cursor() as cur:
        viaroot = "p.pubviaroot" if version >= 130000 else "false"
        gencols = "p.pubgencols::text" if version >= 180000 else "'n'"
        allseqs = "p.puballsequences" if version >= 190000 else "false"  # PostgreSQL 19: FOR ALL SEQUENCES
        for name, alltables, ins, upd, dele, trunc, via, gen, seqs in cur.execute(
                _PUBLICATIONS.format(viaroot=viaroot, gencols=gencols, allseqs=allseqs)):
            actions = {a for a, on in ((PublishAction.INSERT, ins), (PublishAction.UPDATE, upd),
                                       (PublishAction.DELETE, dele), (PublishAction.TRUNCATE, trunc)) if on}
            result.publications[name] = Publication(name=name, all_tables=alltables, actions=frozenset(actions),
                                                    via_root=via, all_sequences=seqs,
                                                    publish_generated_columns="stored" if gen == "s" else "none")
        tables: dict[str, list[PublishedTable]] = {}
        rels_query = _PUBLICATION_RELS_15 if version >= 150000 else _PUBLICATION_RELS_OLD
        for pubname, schema, relname, qual, attnames in cur.execute(rels_query):
            tables.setdefault(pubname, []).append(
                PublishedTable(TableName(schema, relname), _strip_parens(qual),
                               tuple(attnames) if attnames else None))
        schemas: dict[str, list[str]] = {}
        if version >= 150000:
            for pubname, schema in cur.execute(_PUBLICATION_SCHEMAS):
                schemas.setdefault(pubname, []).append(schema)
    for name, pub in list(result.publications.items()):
        result.publications[name] = pub.with_changes(
            tables=tuple(sorted(tables.get(name, []), key=lambda t: t.table)),
            schemas=tuple(sorted(schemas.get(name, []))))
    return result


def _strip_parens(qual: str | None) -> str | None:
    """pg_get_expr wraps an operator expression in one pair of parentheses; keep the inside."""
    if qual is None:
        return None
    if qual.startswith("(") and qual.endswith(")"):
        depth = 0
        for i, ch in enumerate(qual):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(qual) - 1:
                return qual
        return qual[1:-1]
    return qual


_STATE = """
WITH wanted AS (
  SELECT c.oid, n.nspname || '.' || c.relname AS name FROM unnest(%(schemas)s::text[], %(names)s::text[]) AS t(s, r)
  JOIN pg_namespace n ON n.nspname = t.s JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.r
), lineage AS (
  SELECT oid FROM wanted UNION SELECT a.relid FROM wanted w, {ancestors} AS a(relid)
), pub AS (SELECT * FROM pg_publication WHERE pubname = ANY(%(pubs)s))
SELECT jsonb_build_object(
  'present', (SELECT coalesce(jsonb_agg(name ORDER BY name), '[]') FROM wanted),
  'publications', (SELECT coalesce(jsonb_object_agg(p.pubname, jsonb_build_object(
      'all_tables', p.puballtables,
      'publish', to_jsonb(array_remove(ARRAY[CASE WHEN p.pubinsert THEN 'insert' END,
          CASE WHEN p.pubupdate THEN 'update' END, CASE WHEN p.pubdelete THEN 'delete' END,
          CASE WHEN p.pubtruncate THEN 'truncate' END], NULL)),
      'publish_via_partition_root', {viaroot}, 'publish_generated_columns', {gencols})), '{{}}') FROM pub p),
  'members', (SELECT coalesce(jsonb_object_agg(pubname, tables), '{{}}') FROM (
      SELECT p.pubname, jsonb_object_agg(n.nspname || '.' || c.relname, jsonb_build_array({qual}, {attrs})) AS tables
      FROM pg_publication_rel pr JOIN pub p ON p.oid = pr.prpubid JOIN lineage l ON l.oid = pr.prrelid
      JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      GROUP BY p.pubname) m),
  'schemas', {schemas},
  'partitions', (SELECT coalesce(jsonb_object_agg(w.name, k.children), '{{}}') FROM wanted w CROSS JOIN LATERAL (
      SELECT jsonb_agg(n.nspname || '.' || c.relname ORDER BY n.nspname, c.relname) AS children
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE i.inhparent = w.oid) k WHERE k.children IS NOT NULL),
  'generated', (SELECT coalesce(jsonb_object_agg(w.name, g.columns), '{{}}') FROM wanted w CROSS JOIN LATERAL (
      SELECT jsonb_agg(a.attname::text ORDER BY a.attnum) AS columns FROM pg_attribute a
      WHERE a.attrelid = w.oid AND a.attnum > 0 AND NOT a.attisdropped AND {generated}) g
      WHERE g.columns IS NOT NULL))
"""
_STATE_SCHEMAS = """(SELECT coalesce(jsonb_object_agg(pubname, schemas), '{}') FROM (
      SELECT p.pubname, jsonb_agg(n.nspname::text ORDER BY n.nspname) AS schemas FROM pg_publication_namespace pn
      JOIN pub p ON p.oid = pn.pnpubid JOIN pg_namespace n ON n.oid = pn.pnnspid
      WHERE n.nspname = ANY(%(schemas)s) GROUP BY p.pubname) s)"""


def read_publication_state(conn: psycopg.Connection, publications: Sequence[str],
                           tables: Sequence[TableName]) -> dict:
    """What the catalog says now of ``publications`` for the subscribed ``tables`` (core/publication/state.py),
    in one query: what a refresh records and each apply batch of ``filtering: spark`` holds against it. A
    publication feature this version does not understand stops it (publisher/catalog_features.py)."""
    refuse_unknown_features(conn, publications)
    version = conn.info.server_version
    query = _STATE.format(
        ancestors="pg_partition_ancestors(w.oid)" if version >= 120000 else "(SELECT w.oid)",
        viaroot="p.pubviaroot" if version >= 130000 else "false",
        gencols="p.pubgencols::text" if version >= 180000 else "'n'",
        qual="pg_get_expr(pr.prqual, pr.prrelid)" if version >= 150000 else "NULL::text",
        attrs=("(SELECT jsonb_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a "
               "WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs))") if version >= 150000 else "NULL::jsonb",
        schemas=_STATE_SCHEMAS if version >= 150000 else "'{}'::jsonb",
        generated="a.attgenerated <> ''" if version >= 120000 else "false",
    )
    try:
        with conn.cursor() as cur:
            return cur.execute(query, {"schemas": [t.schema for t in tables], "names": [t.name for t in tables],
                                       "pubs": list(publications)}).fetchone()[0]
    except psycopg.Error as e:
        raise CatalogError(f"could not read the publisher's publications: {e}",
                           hint="the publisher role needs SELECT on pg_catalog") from e


def flush_position(conn: psycopg.Connection) -> int:
    """The publisher's WAL flush position now: every transaction committed before it is decodable (replayed,
    on a standby: publisher/slot_health.py ``WAL_END``)."""
    return parse_lsn(conn.execute(f"SELECT {WAL_END}::text").fetchone()[0])


def tables_present(conn: psycopg.Connection, names: Sequence[TableName]) -> bool:
    """Whether every one of the tables ``names`` exists on the publisher under that name."""
    found = conn.execute("SELECT count(*) FROM unnest(%s::text[], %s::text[]) AS t(s, n) "
                         "JOIN pg_namespace ns ON ns.nspname = t.s "
                         "JOIN pg_class c ON c.relnamespace = ns.oid AND c.relname = t.n",
                         ([t.schema for t in names], [t.name for t in names])).fetchone()[0]
    return found == len(names)


def table_names(conn: psycopg.Connection, oids: Sequence[int]) -> dict[int, TableName]:
    """The publisher's current names of the tables ``oids`` (which table a renamed relation was)."""
    rows = conn.execute("SELECT c.oid::int8, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
                        "ON n.oid = c.relnamespace WHERE c.oid = ANY(%s::oid[])", (list(oids),)).fetchall()
    return {oid: TableName(schema, name) for oid, schema, name in rows}
