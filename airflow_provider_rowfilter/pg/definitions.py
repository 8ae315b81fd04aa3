"""Load a subscription's publication definitions from their source and resolve its filters."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psycopg

from airflow_provider_rowfilter.core.catalog import PublisherCatalog
from airflow_provider_rowfilter.core.errors import CatalogError, SpecError
from airflow_provider_rowfilter.core.publication import PublicationSet
from airflow_provider_rowfilter.core.publication_ddl import publications_from_ddl
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.subscription_filters import SubscriptionFilters, subscription_filters
from airflow_provider_rowfilter.pg.catalog import read_catalog, read_publications

PASSWORD_ENV = {"publisher": "ROWFILTER_PUBLISHER_PASSWORD", "subscriber": "ROWFILTER_SUBSCRIBER_PASSWORD"}


@dataclass(frozen=True)
class Definitions:
    """The publisher's catalog, the publications, and what the subscription receives."""

    catalog: PublisherCatalog
    publications: PublicationSet
    filters: SubscriptionFilters
    source: str  # "ddl file <path>" or "publisher catalog"


def connect(url: str | None, role: str, spec: SubscriptionSpec, **params: str) -> psycopg.Connection:
    """Open a connection to the publisher or subscriber (``role``).

    The password never travels in the spec: it comes from ``ROWFILTER_PUBLISHER_PASSWORD`` /
    ``ROWFILTER_SUBSCRIBER_PASSWORD`` (what the Airflow operators set from their connections) or
    from libpq's own ``PGPASSWORD`` / ``~/.pgpass``. ``params`` are further libpq parameters, e.g.
    ``replication="database"``.
    """
    if not url:
        raise SpecError(f"subscription {spec.subscription!r} has no {role} URL",
                        hint=f"set {role}: postgresql://user@host:port/db in the spec "
                        f"(or {role}_conn_id when running from Airflow)")
    try:
        extra = {"password": os.environ[PASSWORD_ENV[role]]} if os.environ.get(PASSWORD_ENV[role]) else {}
        return psycopg.connect(url, autocommit=True, application_name=f"rowfilter:{spec.subscription}",
                               **extra, **params)
    except psycopg.OperationalError as e:
        host = psycopg.conninfo.conninfo_to_dict(url).get("host", "?")
        raise CatalogError(f"cannot connect to the {role} of subscription {spec.subscription!r} at host {host}",
                           detail=str(e).strip().splitlines()[0] if str(e).strip() else None) from e


def load_definitions(spec: SubscriptionSpec, publisher: psycopg.Connection) -> Definitions:
    """Read the catalog, the publications (DDL file or catalog) and resolve the effective filters."""
    catalog = read_catalog(publisher)
    ddl = spec.publications_sql()
    if ddl is not None:
        publications = publications_from_ddl(ddl, catalog)
        source = f"ddl file {spec.publications_ddl}"
    else:
        publications = read_publications(publisher)
        source = "publisher catalog"
    filters = subscription_filters(publications, spec.publications, catalog)
    return Definitions(catalog, publications, filters, source)
