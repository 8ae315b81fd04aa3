"""A publication feature the product does not understand is refused, never ignored (publisher/catalog_features.py).

PostgreSQL 19's ``pg_publication_rel.prexcept`` cannot be made on the PostgreSQL 18 at hand, so the refusal is
tested the other way round: the product is made not to know a column PostgreSQL 18 has (as a version of it
from before that column would not), and a subscribed publication that uses it must be refused by name.
"""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_rowfilter.publisher.catalog_features import (
    KNOWN_COLUMNS,
    UnknownPublicationFeatureError,
    refuse_unknown_features,
    unknown_columns,
)


@pytest.fixture
def publisher(fresh_db):
    with psycopg.connect(fresh_db(), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a int PRIMARY KEY, b text)")
        conn.execute("CREATE TABLE u (a int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION listed FOR TABLE t (a)")  # a column list: prattrs
        conn.execute("CREATE PUBLICATION plain FOR TABLE t, u")
        yield conn


def _without(catalog: str, column: str) -> dict[str, dict[str, int]]:
    known = {c: dict(columns) for c, columns in KNOWN_COLUMNS.items()}
    del known[catalog][column]
    return known


def test_every_column_of_this_server_is_known(publisher):
    assert unknown_columns(publisher) == {}
    refuse_unknown_features(publisher, ["listed", "plain"])


def test_a_column_from_a_later_version_is_unknown_to_an_earlier_server(publisher):
    """A column the table says arrives later than the server's version is one the product cannot read there."""
    known = {c: dict(columns) for c, columns in KNOWN_COLUMNS.items()}
    known["pg_publication_rel"]["prattrs"] = 99
    assert unknown_columns(publisher, known) == {"pg_publication_rel": ["prattrs"]}


def test_a_subscribed_publication_using_an_unknown_column_is_refused(publisher):
    with pytest.raises(UnknownPublicationFeatureError) as raised:
        refuse_unknown_features(publisher, ["plain", "listed"], _without("pg_publication_rel", "prattrs"))
    e = raised.value
    assert e.message == ('publication "listed" uses pg_publication_rel.prattrs, a publication feature of '
                         "PostgreSQL 18 this version of airflow-provider-rowfilter does not understand")
    assert "publications using it: listed" in e.detail
    assert "publications_ddl" in e.hint


def test_an_unknown_column_no_subscribed_publication_uses_changes_nothing(publisher):
    refuse_unknown_features(publisher, ["plain"], _without("pg_publication_rel", "prattrs"))
    # false is not a use: every publication has pubviaroot, none sets it
    refuse_unknown_features(publisher, ["plain", "listed"], _without("pg_publication", "pubviaroot"))
    publisher.execute("ALTER PUBLICATION plain SET (publish_via_partition_root = true)")
    with pytest.raises(UnknownPublicationFeatureError, match='"plain" uses pg_publication.pubviaroot'):
        refuse_unknown_features(publisher, ["plain"], _without("pg_publication", "pubviaroot"))
