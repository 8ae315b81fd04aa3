"""The publication catalog's columns we understand, per PostgreSQL version; a feature we do not is refused.

Each major release may give publications a new feature as a new catalog column: ``pubtruncate`` (11),
``pubviaroot`` (13), ``prqual``/``prattrs`` and ``pg_publication_namespace`` (15), ``pubgencols`` (18), and
in PostgreSQL 19 ``pg_publication_rel.prexcept`` (``FOR ALL TABLES EXCEPT (…)``: a row that *excludes* its
table). Read by a version of this product that does not know the column, such a row would be taken for
what it is not (an excluded table subscribed), so every column of ``pg_publication``,
``pg_publication_rel`` and ``pg_publication_namespace`` is held against :data:`KNOWN_COLUMNS`, and a column
we do not know that a subscribed publication uses (a value that is neither NULL nor false) stops the
refresh and the apply, naming it, instead of replicating the wrong tables. A column we do not know that
no subscribed publication uses changes nothing and is let be.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.core.errors import CatalogError

#: catalog -> column -> the first major version that has it (a column every version has: 10)
KNOWN_COLUMNS: Mapping[str, Mapping[str, int]] = {
    "pg_publication": {"oid": 10, "pubname": 10, "pubowner": 10, "puballtables": 10, "pubinsert": 10,
                       "pubupdate": 10, "pubdelete": 10, "pubtruncate": 11, "pubviaroot": 13, "pubgencols": 18,
                       # PostgreSQL 19's FOR ALL SEQUENCES: publishes no table (flows/sync_sequences.py reads it)
                       "puballsequences": 19},
    "pg_publication_rel": {"oid": 10, "prpubid": 10, "prrelid": 10, "prqual": 15, "prattrs": 15},
    "pg_publication_namespace": {"oid": 15, "pnpubid": 15, "pnnspid": 15},
}
#: how each catalog's rows belong to a publication
_PUBLICATION_OF = {"pg_publication": "oid", "pg_publication_rel": "prpubid", "pg_publication_namespace": "pnpubid"}


class UnknownPublicationFeatureError(CatalogError):
    """A subscribed publication uses a catalog column this version of the product does not understand."""


def unknown_columns(conn: psycopg.Connection, known: Mapping[str, Mapping[str, int]] = KNOWN_COLUMNS
                    ) -> dict[str, list[str]]:
    """The columns of the publication catalogs that ``known`` does not list for the server's version."""
    major = conn.info.server_version // 10000
    found: dict[str, list[str]] = {}
    for catalog, column in conn.execute(
            """SELECT c.relname::text, a.attname::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
               WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relname = ANY(%s)
                 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY c.relname, a.attnum""", (list(known),)):
        if known[catalog].get(column, major + 1) > major:
            found.setdefault(catalog, []).append(column)
    return found


def refuse_unknown_features(conn: psycopg.Connection, publications: Sequence[str],
                            known: Mapping[str, Mapping[str, int]] = KNOWN_COLUMNS) -> None:
    """Raise :class:`UnknownPublicationFeatureError` when one of ``publications`` uses a column ``known`` lacks."""
    for catalog, columns in unknown_columns(conn, known).items():
        for column in columns:
            users = [r[0] for r in conn.execute(sql.SQL(
                """SELECT DISTINCT p.pubname::text FROM pg_catalog.{catalog} x JOIN pg_publication p
                   ON p.oid = x.{owner} WHERE p.pubname = ANY(%s) AND x.{column} IS NOT NULL
                   AND x.{column}::text NOT IN ('false', 'f') ORDER BY 1""").format(
                catalog=sql.Identifier(catalog), owner=sql.Identifier(_PUBLICATION_OF[catalog]),
                column=sql.Identifier(column)), (list(publications),))]
            if users:
                version = conn.info.server_version // 10000
                raise UnknownPublicationFeatureError(
                    f"publication \"{users[0]}\" uses {catalog}.{column}, a publication feature of PostgreSQL "
                    f"{version} this version of airflow-provider-rowfilter does not understand",
                    detail=f"publications using it: {', '.join(users)}. Read without it, the publication could "
                    "subscribe tables it excludes or leave out rows it publishes; nothing was changed.",
                    hint="upgrade airflow-provider-rowfilter to a version that supports PostgreSQL "
                    f"{version}'s publications, or define the subscription's publications in a publications file "
                    "(publications_ddl) without that feature")
