"""Resolve a spec file's Airflow connection ids for the ``rowfilter`` command, in a process of its own.

A spec file of the DAG factory names ``publisher_conn_id``/``subscriber_conn_id`` instead of URLs.
The console command stays free of Airflow (its layer never imports it), so when it meets such a file
it runs ``python -m airflow_provider_rowfilter.hooks.spec_resolver`` with the file's path and reads
back, on this process's stdout (a pipe, never a command line or a log), one JSON document:
``{"spec": <the spec with URLs, as SubscriptionSpec.to_json>, "passwords": {"ROWFILTER_…_PASSWORD": …},
"store": {"AWS_…": …}}``, the last the change log's store credentials from the Airflow connection the spec's
``change_log_conn_id`` names, or ``--change-log-conn-id CONN_ID`` after the path (hooks/store_connection.py).
The connections are looked up wherever Airflow keeps them: ``AIRFLOW_CONN_*``, a secrets backend and
the metadata database (:class:`MetastoreHook`). In a plain process, Airflow 3's task SDK
(``BaseHook.get_connection``) looks at the first two only, since a task reads the metastore through
the api-server; so this process asks Airflow's own ``airflow.models.Connection``, which walks the
configured backends ending with the metastore, exactly as ``airflow connections get`` does.
An error is one JSON document ``{"error": …, "hint": …}`` and exit status 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.hooks.rowfilter import ROLES, RowFilterHook
from airflow_provider_rowfilter.hooks.store_connection import store_environment


class MetastoreHook(RowFilterHook):
    """:class:`RowFilterHook` for a process outside a task: connections from the environment, the secrets
    backends and the metadata database, in Airflow's own order (``[secrets] backend`` first, then
    ``AIRFLOW_CONN_*``, then the metastore)."""

    @classmethod
    def get_connection(cls, conn_id: str) -> Any:
        from airflow.exceptions import AirflowNotFoundException as CoreNotFound
        from airflow.models.connection import Connection

        try:
            return Connection.get_connection_from_secrets(conn_id)
        except CoreNotFound as e:
            raise AirflowNotFoundException(str(e)) from e


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    store_conn_id = None
    if len(args) == 3 and args[1] == "--change-log-conn-id":
        args, store_conn_id = args[:1], args[2]
    if len(args) != 1:
        print(json.dumps({"error": "usage: python -m airflow_provider_rowfilter.hooks.spec_resolver SPEC_FILE "
                          "[--change-log-conn-id CONN_ID]"}))
        return 2
    try:
        resolved = MetastoreHook().resolve_spec(spec=args[0], require=ROLES)
        store_conn_id = store_conn_id or resolved.spec.change_log_conn_id
        if store_conn_id:
            resolved.spec.check_change_log_conn_id(store_conn_id)
            resolved = replace(resolved, store_env=store_environment(store_conn_id, MetastoreHook.get_connection))
    except RowFilterError as e:
        print(json.dumps({"error": e.message, "hint": e.hint}))
        return 1
    print(json.dumps({"spec": resolved.spec.to_json(), "passwords": resolved.password_env(),
                      "store": dict(resolved.store_env)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
