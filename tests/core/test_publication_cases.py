"""PostgreSQL's regression cases for publication row filters and column lists, run through our core.

The fixture (tests/core/fixtures/publication_cases.yaml) is PostgreSQL's truth: the referee test
(tests/e2e/core/test_publication_cases_referee.py) replays every case on a real PostgreSQL 18. Here each
case's DDL goes through ``publications_from_ddl`` against the same catalog, and DML-time
replica-identity cases through ``subscription_filters``; accepted must be accepted, rejected must be
rejected with PostgreSQL's message and detail.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.core.errors import (
    PublicationSyntaxError,
    RowFilterError,
    UntranslatableFilterError,
)
from airflow_provider_rowfilter.core.filters.dialect import parse_statements
from airflow_provider_rowfilter.core.publication.ddl import publications_from_ddl
from airflow_provider_rowfilter.core.publication.model import PublishAction
from airflow_provider_rowfilter.core.publication.subscription_filters import subscription_filters
from airflow_provider_rowfilter.publisher.catalog_reader import read_catalog, read_publications

# Cases where we do not yet answer as PostgreSQL does; each is listed in docs/row-filters.md
# ("Known gaps"). strict: a case that starts to pass fails here until it is removed from the list.
KNOWN_GAPS = frozenset({
    "rf-user-defined-operator",
    "rf-system-column",
    "rf-exists-subquery",
    "ri-rf-partitioned-update-where-false",
    "cl-drop-listed-column-blocked",
})

CASES = yaml.safe_load((Path(__file__).parent / "fixtures" / "publication_cases.yaml").read_text())


def _outcome(dsn: str, case: dict) -> RowFilterError | None:
    ddl = case["ddl"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        if case.get("setup"):
            conn.execute(case["setup"])
        if "PUBLICATION" not in ddl.upper():
            # an ALTER TABLE between the publications and the DML: it changes the catalog we read
            conn.execute(ddl)
            ddl = ""
        catalog = read_catalog(conn)
        existing = read_publications(conn)  # publications the case's setup created natively
    try:
        publications = publications_from_ddl(ddl, catalog, base=existing)
        if case.get("dml"):
            # PostgreSQL checks replica identity for the operation the DML performs
            action = PublishAction.DELETE if case["dml"].lstrip().upper().startswith("DELETE") else PublishAction.UPDATE
            for pub in publications:
                subscription_filters(publications, [pub.name], catalog, checked_actions=[action])
    except UntranslatableFilterError:
        if case.get("error") is None:
            return None  # valid PostgreSQL that we refuse to approximate: not a disagreement here
        raise
    except RowFilterError as e:
        return e
    return None


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="known gap, docs/row-filters.md"))
     if c["id"] in KNOWN_GAPS else c for c in CASES],
    ids=[c["id"] for c in CASES],
)
def test_case_matches_postgresql(case: dict, fresh_db) -> None:
    error = _outcome(fresh_db(), case)
    if case.get("error") is None:
        assert error is None, f"PostgreSQL accepts this, we raised: {error}"
        return
    assert error is not None, f"PostgreSQL rejects this with {case['error']!r}; we accepted it"
    assert (error.message, error.detail) == (case["error"], case.get("detail"))


# The lexical cases (core/filters/pg_lexer.py): PostgreSQL's position too, counted in the whole DDL text as
# PostgreSQL counts it (an error of the filter's analysis carries the filter as its source); the
# grammar's syntax errors (syn-) too.
LEXICAL = [c for c in CASES if c["id"].startswith(("lex-", "syn-")) and c["error"] is not None]


@pytest.mark.parametrize("case", LEXICAL, ids=[c["id"] for c in LEXICAL])
def test_lexical_error_position_matches_postgresql(case: dict, fresh_db) -> None:
    error = _outcome(fresh_db(), case)
    assert error is not None and error.message == case["error"]
    if case.get("position") is None:
        assert error.position is None
        return
    offset = case["ddl"].index(error.source)
    assert offset + error.position == case["position"], str(error)
    if case["id"].startswith("lex-"):
        assert error.hint, f"no fix given: {error}"


# What PostgreSQL 15 reads differently (the cases' pg15 overrides): the publisher's version decides.
PG15_LEXICAL = [c for c in CASES if c["id"].startswith("lex-") and (c.get("pg15") or {}).get("error")]


@pytest.mark.parametrize("case", PG15_LEXICAL, ids=[c["id"] for c in PG15_LEXICAL])
def test_lexical_case_on_postgresql_15(case: dict) -> None:
    with pytest.raises(PublicationSyntaxError) as caught:
        parse_statements(case["ddl"], server_version_num=150018)
    assert (caught.value.message, caught.value.position) == (case["pg15"]["error"], case["pg15"]["position"])
