"""Load a subscription's publication definitions from their source and resolve its filters."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import psycopg

from airflow_provider_rowfilter.core.catalog import PublisherCatalog
from airflow_provider_rowfilter.core.publication import PublicationSet
from airflow_provider_rowfilter.core.publication_ddl import publications_from_ddl, table_refusals
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.subscription_filters import SubscriptionFilters, subscription_filters
from airflow_provider_rowfilter.publisher.catalog_reader import read_catalog, read_publications


@dataclass(frozen=True)
class Definitions:
    """The publisher's catalog, the publications, and what the subscription receives."""

    catalog: PublisherCatalog
    publications: PublicationSet
    filters: SubscriptionFilters
    source: str  # "ddl file <path>" or "publisher catalog"


def load_definitions(spec: SubscriptionSpec, publisher: psycopg.Connection) -> Definitions:
    """Read the catalog, the publications (DDL file or catalog) and resolve the effective filters."""
    catalog = read_catalog(publisher)
    ddl = spec.publications_sql()
    skip = spec.on_invalid_table == "skip"
    if ddl is not None:
        with table_refusals() if skip else nullcontext():
            publications = publications_from_ddl(ddl, catalog)
        source = f"ddl file {spec.publications_ddl}"
    else:
        publications = read_publications(publisher)
        source = "publisher catalog"
    filters = subscription_filters(publications, spec.publication_names, catalog, skip_invalid=skip)
    return Definitions(catalog, publications, filters, source)
