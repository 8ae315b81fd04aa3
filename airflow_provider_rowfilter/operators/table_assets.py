"""How Airflow and OpenLineage name a subscriber or publisher table: the asset URI and the dataset of the postgres provider.

ApplyChangesOperator emits an asset event per changed subscriber table on its ``AssetAlias`` outlet and
reports the tables it read and changed to OpenLineage; both name a table the way the postgres provider does,
so a DAG scheduled on that asset runs after an apply changed the table.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_rowfilter.connection import conninfo_params
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.values import SUBSCRIPTION_NAME


def default_asset_alias(subscription: Any) -> str | None:
    """``rowfilter_<subscription>`` when the subscription is a plain name known when the DAG is parsed."""
    if isinstance(subscription, str) and SUBSCRIPTION_NAME.match(subscription):
        return f"rowfilter_{subscription}"
    return None


def table_asset_uri(url: str, table: TableName | str) -> str:
    """``postgres://host:port/database/schema/table``: the postgres provider's asset URI of a table."""
    host, port, database = _location(url)
    table = TableName.parse(table) if isinstance(table, str) else table
    return f"postgres://{host}:{port}/{database}/{table.schema}/{table.name}"


def openlineage_dataset(url: str, table: TableName | str) -> tuple[str, str]:
    """``(namespace, name)`` of a table as OpenLineage names PostgreSQL datasets (``postgres://host:port``,
    ``database.schema.table``), the same as the postgres provider's asset conversion."""
    host, port, database = _location(url)
    table = TableName.parse(table) if isinstance(table, str) else table
    return f"postgres://{host}:{port}", f"{database}.{table.schema}.{table.name}"


def _location(url: str) -> tuple[str, int, str]:
    info = conninfo_params(url, "the subscriber's connection string")
    host = str(info.get("host") or "localhost").split(",")[0]
    if host.startswith("/"):  # a Unix socket directory: the server is this machine
        host = "localhost"
    port = int(str(info.get("port") or 5432).split(",")[0])
    database = str(info.get("dbname") or info.get("user") or "postgres")
    return host, port, database
