"""A table's name as SQL: the one place a :class:`TableName` becomes a quoted ``schema.table``."""

from __future__ import annotations

from psycopg import sql

from airflow_provider_rowfilter.core.relation import TableName


def table_sql(table: TableName) -> sql.Identifier:
    """``"schema"."table"``, each part quoted by psycopg as ``quote_ident`` would."""
    return sql.Identifier(table.schema, table.name)
