"""Load a subscription's publication definitions from their source and resolve its filters."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psycopg

from airflow_provider_rowfilter.core.catalog import PublisherCatalog
from airflow_provider_rowfilter.core.conninfo import PASSWORD_ENV, check_no_password, parse
from airflow_provider_rowfilter.core.errors import CatalogError, SpecError
from airflow_provider_rowfilter.core.publication import PublicationSet
from airflow_provider_rowfilter.core.publication_ddl import publications_from_ddl
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.subscription_filters import SubscriptionFilters, subscription_filters
from airflow_provider_rowfilter.pg.catalog_reader import read_catalog, read_publications

__all__ = ["PASSWORD_ENV", "Definitions", "connect", "conninfo_params", "load_definitions"]


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
    what = f"the {role} of subscription {spec.subscription!r}"
    check_no_password(url, what, role)
    try:
        extra = {"password": os.environ[PASSWORD_ENV[role]]} if os.environ.get(PASSWORD_ENV[role]) else {}
        return psycopg.connect(url, autocommit=True, application_name=f"rowfilter:{spec.subscription}",
                               **extra, **params)
    except psycopg.OperationalError as e:
        host = next((p.value for p in parse(url) if p.key == "host"), "?")
        raise CatalogError(f"cannot connect to the {role} of subscription {spec.subscription!r} at host {host}",
                           detail=str(e).strip().splitlines()[0] if str(e).strip() else None) from e
    except psycopg.ProgrammingError as e:  # libpq refused a keyword or value (the string holds no secret)
        raise SpecError(f"{what} is not a valid connection string: {str(e).strip()}") from None


def conninfo_params(url: str, what: str, role: str | None = None) -> dict[str, str]:
    """The libpq parameters of ``url`` as libpq reads them; refused (never quoted) when it holds a secret.

    libpq's own parse errors quote the string; :func:`check_no_password` runs first, so by then the
    string holds no secret and the message may show it.
    """
    check_no_password(url, what, role)
    try:
        return {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(url).items()}
    except (psycopg.ProgrammingError, UnicodeDecodeError) as e:
        raise SpecError(f"{what} is not a valid connection string: {str(e).strip()}") from None


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
