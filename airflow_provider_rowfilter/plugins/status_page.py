"""The "Replication" page of Airflow's UI: every subscription of the DAG factory, its health, lag and batches.

Two parts, through Airflow 3's plugin interface:

- a React app (``react_apps``) that Airflow's UI loads into its own page, under *Browse → Replication*
  (route ``/plugin/rowfilter``): ``replication.js`` beside this module, plain JavaScript that draws with
  the UI's own React and Chakra UI (``globalThis.React``, ``globalThis.ChakraUI``), so it has Airflow's
  look, its light and dark modes, and needs no build step and no CDN. It reads the JSON below and
  reads it again every 15 seconds, without reloading the page; its actions trigger the factory's
  skip, resync and drop DAGs through Airflow's own REST API (``POST /api/v2/dags/{dag_id}/dagRuns``),
  as the signed-in user, whose permissions Airflow checks;
- a FastAPI app (``fastapi_apps``) mounted by the api-server under ``/rowfilter``: ``/rowfilter/api/
  subscriptions`` (the page's data: plugins/replication_view.py) and ``/rowfilter/replication.js``.
  ``/rowfilter/`` sends a browser to the page. No API docs are served (``/docs``, ``/redoc`` and
  ``/openapi.json`` are off): they would load Swagger's scripts from a CDN under Airflow's origin.

Only signed-in users get the data (Airflow's token, as for every API route), and each only the
subscriptions whose incremental-sync DAG they may read, asked with the DAG's team as Airflow's own
routes ask; an invalid spec file's error only to those who may also see import errors.
Nothing here writes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from pathlib import Path
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView, DagDetails
from airflow.api_fastapi.common.router import AirflowRouter
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse

from airflow_provider_rowfilter.dag_factory import SubscriptionFile
from airflow_provider_rowfilter.operators.replication_link import PAGE_ROUTE, ReplicationPageLink
from airflow_provider_rowfilter.plugins.replication_view import (
    RunFacts,
    SubscriptionView,
    invalid_view,
    placeholder_dag_id,
    read_view,
    run_facts,
    spec_files,
    subscriptions_folder,
)

BUNDLE = Path(__file__).with_name("replication.js")


def visible_views(user: Any) -> list[SubscriptionView]:
    """The subscriptions of the folder ``user`` may read (see the module), read now."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    manager = get_auth_manager()

    def may_read(dag_id: str) -> bool:
        details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id))
        return manager.is_authorized_dag(method="GET", details=details, user=user)

    views = []
    now = dt.datetime.now(dt.timezone.utc)
    with create_session() as session:
        for path in spec_files(subscriptions_folder()):
            try:
                source = SubscriptionFile.load(path)
            except Exception as e:  # a broken file is shown, not fatal (its DAG says the same)
                dag_id = placeholder_dag_id(path)
                if manager.is_authorized_view(access_view=AccessView.IMPORT_ERRORS, user=user) and may_read(dag_id):
                    views.append(invalid_view(path, e, dag_id, run_facts(dag_id, session, now)))
                continue
            dag_id = source.dag_ids["incremental_sync"]
            if may_read(dag_id):
                views.append(read_view(source, run_facts(dag_id, session, now, source.dag_ids["watch"])
                                       if dag_id else RunFacts()))
    return views


router = AirflowRouter(tags=["rowfilter"])


@router.get("/", include_in_schema=False)
def page() -> RedirectResponse:
    """The page is the UI's (a React app): a browser that asks here is sent there."""
    return RedirectResponse(f"../{PAGE_ROUTE}")


@router.get("/api/subscriptions")
def subscriptions(user: GetUserDep) -> list[dict[str, Any]]:
    return [asdict(v) for v in visible_views(user)]


@router.get("/replication.js", include_in_schema=False)
def bundle() -> FileResponse:
    """The page's code (no data): loaded by Airflow's UI as any plugin's bundle."""
    return FileResponse(BUNDLE, media_type="text/javascript", headers={"Cache-Control": "no-cache"})


app = FastAPI(title="Row filter replication", description="Subscriptions' states, lag, errors and batches",
              docs_url=None, redoc_url=None, openapi_url=None)
app.include_router(router)


class RowFilterPlugin(AirflowPlugin):
    """Mounts the data at ``/rowfilter``, the page in the UI's Browse menu, and the apply task's link to it."""

    name = "rowfilter"
    fastapi_apps = [{"app": app, "url_prefix": "/rowfilter", "name": "Replication (rowfilter)"}]
    react_apps = [{"name": "Replication", "bundle_url": "rowfilter/replication.js", "destination": "nav",
                   "category": "browse", "url_route": "rowfilter"}]
    operator_extra_links = [ReplicationPageLink()]
