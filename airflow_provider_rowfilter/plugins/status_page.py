"""The "Replication" page of Airflow's UI: what ``rowfilter status`` shows, per subscription of the DAG factory.

A FastAPI app that Airflow's api-server mounts under ``/rowfilter`` (an Airflow 3 plugin's
``fastapi_apps``) and a link in the UI's *Browse* menu (``external_views``, shown inside the UI).
The subscriptions are the factory's spec files: ``$ROWFILTER_SUBSCRIPTIONS_DIR``, or ``subscriptions/``
in the DAGs folder, as dags/rowfilter_subscriptions.py reads them. For each, the subscriber is read
through its ``subscriber_conn_id`` (states, positions, rows copied, errors, the last batches) and the
publisher through ``publisher_conn_id`` (the WAL the slot holds back, read now).

Only signed-in users see it (Airflow's own token, as for every API route), and each sees only the
subscriptions whose incremental-sync DAG they may read (the auth manager's ``is_authorized_dag``).
Nothing here writes: skip, resync and drop are the factory's operations DAGs (docs/dag-factory.md).
"""

from __future__ import annotations

import html
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.common.router import AirflowRouter
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.dag_factory import SPEC_PATTERNS, SubscriptionFile
from airflow_provider_rowfilter.hooks.rowfilter import RowFilterHook
from airflow_provider_rowfilter.humane import duration, size
from airflow_provider_rowfilter.publisher.slot_health import read_slot
from airflow_provider_rowfilter.subscriber.state_reader import StateReader

BATCHES_SHOWN = 10


def subscriptions_folder() -> Path:
    """Where the factory's spec files are (the same setting as dags/rowfilter_subscriptions.py)."""
    chosen = os.environ.get("ROWFILTER_SUBSCRIPTIONS_DIR")
    return Path(chosen) if chosen else Path(conf.get("core", "dags_folder")) / "subscriptions"


@dataclass
class SubscriptionView:
    """One subscription as the page shows it; ``error`` when it could not be read (the rest may be empty)."""

    subscription: str
    spec_file: str
    dag_id: str
    tables: list[dict[str, Any]] = field(default_factory=list)
    last_error: str | None = None
    applied_lsn: str | None = None
    batches: list[dict[str, Any]] = field(default_factory=list)
    slot: dict[str, Any] | None = None
    error: str | None = None


def read_view(source: SubscriptionFile) -> SubscriptionView:
    spec = source.spec
    view = SubscriptionView(spec.subscription, str(source.path), source.dag_ids["incremental_sync"])
    try:
        with RowFilterHook.endpoint(spec.subscriber_conn_id or "", "subscriber").connect(connect_timeout=5) as conn:
            reader = StateReader(conn, spec.subscription)
            row = reader.subscription_row()
            if row is None:
                view.error = "no state in the subscriber yet: run the initial-sync DAG"
                return view
            view.last_error, view.applied_lsn = row.last_error, row.applied_lsn
            view.tables = [{"table": str(t.table), "state": t.state.value, "label": t.state.label, "lsn": t.lsn,
                            "rows_copied": t.rows_copied, "last_error": t.last_error,
                            "updated_at": t.updated_at.isoformat()} for t in reader.tables()]
            last = reader.last_batch_id()
            view.batches = [{"id": b.id, "finished_at": b.finished_at.isoformat(), "end_lsn": b.end_lsn,
                             "changes": b.changes, "transactions": b.transactions, "lag_seconds": b.lag_seconds,
                             "duration_ms": b.duration_ms}
                            for b in reversed(reader.batches_after(max(last - BATCHES_SHOWN, 0)))]
        if spec.publisher_conn_id:
            with RowFilterHook.endpoint(spec.publisher_conn_id, "publisher").connect(connect_timeout=5) as conn:
                _, slot = read_slot(conn, row.slot_name)
            view.slot = slot.as_dict()
    except (RowFilterError, psycopg.Error) as e:
        view.error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return view


def visible_views(user: Any) -> list[SubscriptionView]:
    """The subscriptions of the folder whose incremental-sync DAG ``user`` may read; a broken file is shown as such."""
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    folder = subscriptions_folder()
    files = sorted({p for pattern in SPEC_PATTERNS for p in folder.glob(pattern) if p.is_file()})
    views = []
    for path in files:
        try:
            source = SubscriptionFile.load(path)
        except Exception as e:  # a broken file is shown, not fatal (its DAG says the same)
            if manager.is_authorized_view(access_view=_IMPORT_ERRORS, user=user):
                views.append(SubscriptionView(path.stem, str(path), "", error=f"invalid spec file: {e}"))
            continue
        if manager.is_authorized_dag(method="GET", details=DagDetails(id=source.dag_ids["incremental_sync"]),
                                     user=user):
            views.append(read_view(source))
    return views


def _access_view(name: str) -> Any:
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView

    return AccessView[name]


_IMPORT_ERRORS = _access_view("IMPORT_ERRORS")


# --- the page ------------------------------------------------------------------------------------------
def render(views: list[SubscriptionView], folder: Path) -> str:
    e = html.escape
    parts = [_HEAD, f"<h1>Replication</h1><p class=muted>Subscriptions of {e(str(folder))}, read now. "
             "The same as <code>rowfilter status</code>.</p>"]
    if not views:
        parts.append("<p>No subscription you may read.</p>")
    for v in views:
        parts.append(f"<section><h2>{e(v.subscription)}</h2><p class=muted>{e(v.spec_file)}"
                     + (f" · DAG <a href='../dags/{e(v.dag_id)}' target=_top>{e(v.dag_id)}</a>" if v.dag_id else "")
                     + (f" · applied through {e(v.applied_lsn)}" if v.applied_lsn else "") + "</p>")
        if v.error:
            parts.append(f"<p class=error>{e(v.error)}</p>")
        if v.last_error:
            parts.append(f"<p class=error>last error: {e(v.last_error)}</p>")
        if v.slot is not None:
            slot = v.slot
            parts.append(f"<p>slot <code>{e(slot['name'])}</code>: " + (
                "<span class=error>does not exist on the publisher</span>" if not slot["exists"] else
                f"{e(str(slot['wal_status'] or ''))}, retains {_retained(slot['retained_bytes'])} of WAL now, "
                f"{'read by a session' if slot['active'] else 'not read now'}") + "</p>")
        if v.tables:
            parts.append(_table(["table", "state", "lsn", "rows copied", "updated", "last error"], [
                [t["table"], f"{t['state']} {t['label']}", t["lsn"] or "", _count(t["rows_copied"]), t["updated_at"],
                 t["last_error"] or ""] for t in v.tables]))
        if v.batches:
            parts.append("<h3>Last batches</h3>" + _table(
                ["batch", "finished", "end lsn", "changes", "transactions", "lag then", "took"],
                [[str(b["id"]), b["finished_at"], b["end_lsn"] or "", _count(b["changes"]), _count(b["transactions"]),
                  "" if b["lag_seconds"] is None else duration(b["lag_seconds"]),
                  "" if b["duration_ms"] is None else duration(b["duration_ms"] / 1000)] for b in v.batches]))
        parts.append("</section>")
    return "".join(parts) + "</body></html>"


def _table(header: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _retained(n: int | None) -> str:
    return "an unknown amount" if n is None else size(n)


def _count(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


_HEAD = ("<!doctype html><html><head><meta charset=utf-8><title>Replication</title><style>"
         "body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1f2328}"
         "table{border-collapse:collapse;margin:.5rem 0 1rem}th,td{border-bottom:1px solid #d0d7de;padding:.25rem .6rem;"
         "text-align:left;white-space:nowrap}td:last-child{white-space:normal}.muted{color:#656d76}"
         ".error{color:#cf222e}code{font-family:ui-monospace,monospace}</style></head><body>")

router = AirflowRouter(tags=["rowfilter"])


@router.get("/", response_class=HTMLResponse)
def page(user: GetUserDep) -> str:
    return render(visible_views(user), subscriptions_folder())


@router.get("/api/subscriptions")
def subscriptions(user: GetUserDep) -> list[dict[str, Any]]:
    return [asdict(v) for v in visible_views(user)]


app = FastAPI(title="Row filter replication", description="Subscriptions' states, lag, errors and batches")
app.include_router(router)


class RowFilterPlugin(AirflowPlugin):
    """Mounts the page at ``/rowfilter`` and links it in the UI's Browse menu."""

    name = "rowfilter"
    fastapi_apps = [{"app": app, "url_prefix": "/rowfilter", "name": "Replication (rowfilter)"}]
    external_views = [{"name": "Replication", "href": "/rowfilter/", "destination": "nav", "category": "browse",
                       "url_route": "rowfilter"}]
