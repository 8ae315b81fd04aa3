"""The apply's session_replication_role (issue 18, item 10; issue 29, item 7).

On a real subscriber, as a role without superuser: nothing said when nothing the transaction writes
fires differently (a foreign key elsewhere in the database does not count); one line naming the fix
(PostgreSQL 15's ``GRANT SET ON PARAMETER``) when a written table's foreign key would fire, once per
process however many batches; and, once granted, the apply runs as ``replica`` as PostgreSQL's apply
worker does.
"""

from __future__ import annotations

import logging

import psycopg
import pytest

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.subscriber.replica_role import replica_role

ROLE = "rowfilter_applier"


@pytest.fixture
def applier(fresh_db):
    """A subscriber database and a connection to it as a role that is not a superuser."""
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {ROLE}")
        conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD 'applier-pw'")
        conn.execute(f"GRANT ALL ON SCHEMA public TO {ROLE}")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    with psycopg.connect(**{**info, "user": ROLE, "password": "applier-pw"}) as conn:
        yield dsn, conn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {ROLE}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"REVOKE SET ON PARAMETER session_replication_role FROM {ROLE}")
        conn.execute(f"DROP ROLE {ROLE}")


def role_in_a_batch(conn: psycopg.Connection, *tables: str) -> str:
    with conn.transaction():
        replica_role(conn, "apply", tables=[TableName("public", t) for t in tables or ("child",)])
        return conn.execute("SHOW session_replication_role").fetchone()[0]


@pytest.fixture(autouse=True)
def _fresh_process_memory(monkeypatch):
    from airflow_provider_rowfilter.subscriber import replica_role as module

    monkeypatch.setattr(module, "_warned", set())


def test_nothing_fires_differently_no_warning(applier, caplog):
    _, conn = applier
    conn.execute("CREATE TABLE t (id int PRIMARY KEY); "
                 "CREATE TABLE parent (id int PRIMARY KEY); CREATE TABLE child (id int PRIMARY KEY, p int REFERENCES parent)")
    caplog.set_level(logging.INFO, logger="airflow_provider_rowfilter.subscriber.replica_role")
    assert role_in_a_batch(conn, "t") == "origin"  # the foreign key of child and parent is not written to
    assert caplog.records == [], caplog.text


def test_a_foreign_key_warns_once_with_the_fix_then_the_grant_fixes_it(applier, caplog):
    dsn, conn = applier
    conn.execute("CREATE TABLE parent (id int PRIMARY KEY); "
                 "CREATE TABLE child (id int PRIMARY KEY, p int REFERENCES parent); CREATE TABLE t (id int)")
    conn.commit()
    caplog.set_level(logging.INFO, logger="airflow_provider_rowfilter.subscriber.replica_role")
    assert role_in_a_batch(conn, "child", "t") == "origin"
    assert role_in_a_batch(conn, "child", "t") == "origin"  # the next batch of the run: said once
    (record,) = caplog.records
    assert record.levelname == "WARNING" and "\n" not in record.getMessage()
    assert "the triggers and foreign keys of child fire during this apply" in record.getMessage()
    assert f"fix: GRANT SET ON PARAMETER session_replication_role TO {ROLE}" in record.getMessage()

    with psycopg.connect(dsn, autocommit=True) as admin:  # the fix the warning names
        admin.execute(f"GRANT SET ON PARAMETER session_replication_role TO {ROLE}")
    caplog.clear()
    assert role_in_a_batch(conn) == "replica"
    assert caplog.records == []


def test_a_copy_warns_only_for_a_table_whose_own_triggers_fire_differently(applier, caplog):
    """The initial copy asks per table copied (subscriber/replica_role.py): a foreign key elsewhere in the
    subscriber changes nothing for it."""
    _, conn = applier
    conn.execute("CREATE TABLE parent (id int PRIMARY KEY); "
                 "CREATE TABLE child (id int PRIMARY KEY, p int REFERENCES parent); CREATE TABLE t (id int)")
    conn.commit()
    caplog.set_level(logging.INFO, logger="airflow_provider_rowfilter.subscriber.replica_role")
    for table in ("t", "child"):
        with conn.transaction():
            replica_role(conn, "copy", TableName("public", table))
    assert [r.levelname for r in caplog.records] == ["WARNING"], caplog.text
    assert "of child fire during this copy, unlike PostgreSQL's table-sync worker" in caplog.records[0].getMessage()
