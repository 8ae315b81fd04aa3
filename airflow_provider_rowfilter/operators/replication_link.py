"""The apply task's extra link to the Replication page (*Browse → Replication*, plugins/status_page.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urljoin

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

#: The page's route in Airflow's UI (a plugin's React app is at ``plugin/<url_route>``).
PAGE_ROUTE = "plugin/rowfilter"


def page_url(subscription: str | None = None) -> str:
    """The page, under Airflow's ``[api] base_url`` as Airflow builds its own links; ``#<subscription>``
    scrolls to that subscription."""
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback="/") or "/"
    url = urljoin(base.rstrip("/") + "/", PAGE_ROUTE)
    return f"{url}#{quote(subscription, safe='')}" if subscription else url


class ReplicationPageLink(BaseOperatorLink):
    """*Replication*: the subscription on the Replication page (its health, lag, batches and errors)."""

    name = "Replication"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        return page_url(subscription_of(operator))


def subscription_of(operator: Any) -> str | None:
    """The operator's subscription: its argument, else its spec file's (None when neither can be read)."""
    name = getattr(operator, "subscription", None)
    if isinstance(name, str) and name and "{{" not in name:
        return name
    path = getattr(operator, "spec", None)
    if isinstance(path, str) and path and "{{" not in path:
        from airflow_provider_rowfilter.core.errors import RowFilterError
        from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

        try:
            return SubscriptionSpec.load(path).subscription
        except (RowFilterError, OSError):
            return None
    return None
