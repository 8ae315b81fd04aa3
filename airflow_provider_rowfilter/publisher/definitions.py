"""Load a subscription's publication definitions from their source and resolve its filters."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import psycopg

from airflow_provider_rowfilter.core.errors import ReplicaIdentityError, RowFilterError
from airflow_provider_rowfilter.core.publication.catalog import PublisherCatalog
from airflow_provider_rowfilter.core.publication.ddl import publications_from_ddl, table_refusals
from airflow_provider_rowfilter.core.publication.model import PublicationSet
from airflow_provider_rowfilter.core.publication.subscription_filters import SubscriptionFilters, subscription_filters
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.publisher.catalog_features import refuse_unknown_features
from airflow_provider_rowfilter.publisher.catalog_reader import read_catalog, read_publications


@dataclass(frozen=True)
class Definitions:
    """The publisher's catalog, the publications, and what the subscription receives."""

    catalog: PublisherCatalog
    publications: PublicationSet
    filters: SubscriptionFilters
    source: str  # "ddl file <path>" or "publisher catalog"
    filtering: str = "spark"  # who evaluates them: source (the publisher's pgoutput) or spark (core/spec/subscription.py)
    #: what PostgreSQL will refuse on the publisher itself (filtering: source only, where it is the publisher's to say)
    warnings: tuple[str, ...] = ()


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
        # a feature of the publisher's publications we do not understand stops here (publisher/catalog_features.py)
        refuse_unknown_features(publisher, spec.publication_names)
        publications = read_publications(publisher)
        source = "publisher catalog"
    return resolve_definitions(spec, publisher, catalog, publications, source)


def definitions_after(spec: SubscriptionSpec, publisher: psycopg.Connection, current: Definitions,
                      statements: str) -> Definitions:
    """What the subscription would receive after ``statements`` (``ALTER PUBLICATION …``, as a publications file
    holds them) on top of ``current``: applied with PostgreSQL's rules and refusals (core/publication/ddl.py),
    never run on the publisher."""
    skip = spec.on_invalid_table == "skip"
    with table_refusals() if skip else nullcontext():
        publications = publications_from_ddl(statements, current.catalog, base=current.publications)
    return resolve_definitions(spec, publisher, current.catalog, publications, f"{current.source}, then the what-if")


def resolve_definitions(spec: SubscriptionSpec, publisher: psycopg.Connection, catalog: PublisherCatalog,
                        publications: PublicationSet, source: str) -> Definitions:
    """The subscription's effective filters under ``publications``, evaluated by whom the spec says."""
    skip = spec.on_invalid_table == "skip"
    filtering = spec.filtering_mode(publisher.info.server_version)
    spec.origin_option(publisher.info.server_version)  # origin = none before PostgreSQL 16: refused here, first
    if filtering == "spark":
        filters = subscription_filters(publications, spec.publication_names, catalog, skip_invalid=skip)
        return Definitions(catalog, publications, filters, source)
    # The publisher's own definitions, evaluated by the publisher: what it accepts replicates. A filter or
    # column list its replica identity does not cover makes PostgreSQL refuse the publisher's UPDATE or
    # DELETE of the table (CheckCmdReplicaIdentity in src/backend/executor/execReplication.c), not the
    # subscription; its INSERTs replicate. Said as a warning, PostgreSQL's message.
    filters = subscription_filters(publications, spec.publication_names, catalog, checked_actions=(),
                                   publisher_evaluates=True, skip_invalid=skip)
    warnings = []
    try:
        subscription_filters(publications, spec.publication_names, catalog, publisher_evaluates=True)
    except ReplicaIdentityError as e:
        warnings.append(f"the publisher will refuse this when it happens (its INSERTs replicate): {e}")
    except RowFilterError:
        if not skip:
            raise  # the first resolution raised it already; with skip, its table is in filters.refused

    return Definitions(catalog, publications, filters, source, filtering, tuple(warnings))
