"""The replication-origin warning once per condition, not per run (issue 46 item 4), and its GRANT works.

A role that may not use the replication origin functions applies untagged and is warned; a later run (another
process: the module's memory cleared) of the same role says nothing more, since the subscriber records the
condition; the GRANT the warning names lets the role tag its writes (and clears the record, so a later revoke
warns again). Real PostgreSQL 18, a role without superuser.
"""

from __future__ import annotations

import logging
import re

import psycopg
import pytest

from airflow_provider_rowfilter.subscriber import replication_origin
from airflow_provider_rowfilter.subscriber.state import StateStore, migrate

ROLE = "rowfilter_untagged"


@pytest.fixture
def applier(fresh_db):
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        with conn.transaction():
            StateStore(conn, "s1").ensure_subscription(["p1"], "rowfilter_s1", "rowfilter_s1", {})
        conn.execute(f"DROP ROLE IF EXISTS {ROLE}")
        conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD 'untagged-pw'")
        conn.execute(f"GRANT USAGE ON SCHEMA rowfilter TO {ROLE}")
        conn.execute(f"GRANT SELECT, UPDATE ON rowfilter.subscription TO {ROLE}")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    yield dsn, {**info, "user": ROLE, "password": "untagged-pw"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname LIKE "
                     "'rowfilter\\_%\\_s1'")
        conn.execute(f"DROP OWNED BY {ROLE}")
        conn.execute(f"DROP ROLE {ROLE}")


def a_run(params: dict, monkeypatch) -> bool:
    """One apply's setup of the origin, in a process of its own (the module's memory cleared)."""
    monkeypatch.setattr(replication_origin, "_warned", set())
    monkeypatch.setattr(replication_origin, "_cleared", set())
    with psycopg.connect(**params, autocommit=True) as conn, replication_origin.session_origin(conn, "s1") as tagged:
        return tagged


def test_warned_once_per_condition_and_the_grant_fixes_it(applier, monkeypatch, caplog):
    dsn, params = applier
    caplog.set_level(logging.DEBUG, logger=replication_origin.__name__)
    assert a_run(params, monkeypatch) is False
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    grant = re.search(r"fix: (GRANT EXECUTE ON FUNCTION .*)$", warning.getMessage()).group(1)
    caplog.clear()
    assert a_run(params, monkeypatch) is False and a_run(params, monkeypatch) is False  # later runs: nothing more
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == [], caplog.text

    with psycopg.connect(dsn, autocommit=True) as conn:  # the warning's own fix, as a superuser runs it
        conn.execute(grant)
    assert a_run(params, monkeypatch) is True
    assert "carry the replication origin again" in caplog.text
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT options ? %s FROM rowfilter.subscription WHERE name = 's1'",
                            (replication_origin.REFUSED_KEY,)).fetchone() == (False,)
        conn.execute(grant.replace("GRANT", "REVOKE", 1).replace(" TO ", " FROM "))
    caplog.clear()
    assert a_run(params, monkeypatch) is False  # the condition back: warned again
    assert [r.levelno for r in caplog.records] == [logging.WARNING], caplog.text
