"""The change log's object-store credentials from an Airflow connection, as the environment the store's SDK reads.

A change log on object storage (docs/change-log.md, "On object storage") reads its credentials from the
standard environment of each process. Operators may take them from an Airflow connection instead
(``change_log_conn_id``): an ``aws`` connection (login: access key id, password: secret access key;
extras ``region_name``, ``endpoint_url`` (or ``service_config: {s3: {endpoint_url}}``),
``aws_session_token``, ``profile_name``), a ``google_cloud_platform`` one (extra ``key_path``: the
service account's key file on the workers) or a ``wasb`` one (a service principal: login the client
id, password its secret, extra ``tenant_id``). The values reach the task's own run through its
environment while it runs (:func:`environment`), and the job like the databases' passwords: its
environment, never its command line (operators/rowfilter_job.py refuses where spark-submit would put
them there). The ``rowfilter`` command takes the same connection (the spec's ``change_log_conn_id`` or
``--change-log-conn-id``) through hooks/spec_resolver.py, into its own environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_rowfilter.core.errors import SpecError

STORE_CONN_TYPES = ("aws", "google_cloud_platform", "wasb")


def store_environment(conn_id: str, get_connection: Callable[[str], Any] | None = None) -> dict[str, str]:
    """The environment variables that give the store's SDK the connection's credentials.

    :param get_connection: how the connection is looked up; default a task's (``BaseHook.get_connection``), the
        ``rowfilter`` command's resolver passes Airflow's own walk of the secrets backends and the metadata
        database (hooks/spec_resolver.py).
    :raises SpecError: no such connection, or one of another type (naming it and the types taken).
    """
    try:
        conn = (get_connection or BaseHook.get_connection)(conn_id)
    except AirflowNotFoundException as e:
        raise SpecError(f"change_log_conn_id {conn_id!r}: no such Airflow connection",
                        hint=f"create a connection of type {', '.join(STORE_CONN_TYPES)} with that id") from e
    extra: Mapping[str, Any] = conn.extra_dejson or {}
    if conn.conn_type == "aws":
        endpoint = extra.get("endpoint_url") or ((extra.get("service_config") or {}).get("s3") or {}).get("endpoint_url")
        values = {"AWS_ACCESS_KEY_ID": conn.login, "AWS_SECRET_ACCESS_KEY": conn.password,
                  "AWS_SESSION_TOKEN": extra.get("aws_session_token"), "AWS_REGION": extra.get("region_name"),
                  "AWS_ENDPOINT_URL": endpoint, "AWS_PROFILE": extra.get("profile_name")}
    elif conn.conn_type == "google_cloud_platform":
        values = {"GOOGLE_APPLICATION_CREDENTIALS": extra.get("key_path") or extra.get(
            "extra__google_cloud_platform__key_path")}
    elif conn.conn_type == "wasb":
        values = {"AZURE_CLIENT_ID": conn.login, "AZURE_CLIENT_SECRET": conn.password,
                  "AZURE_TENANT_ID": extra.get("tenant_id")}
    else:
        raise SpecError(f"change_log_conn_id {conn_id!r} is a {conn.conn_type!r} connection, not an object store's",
                        hint=f"use a connection of type {', '.join(STORE_CONN_TYPES)}, or leave change_log_conn_id "
                        "out and give the workers the store's credentials in their environment")
    return {k: str(v) for k, v in values.items() if v}
