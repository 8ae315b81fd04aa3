"""The apply's session_replication_role (issue 18, item 10): a role that may not set it warned on every run.

On a real subscriber, as a role without superuser: no warning when nothing fires differently; one
line naming the fix (PostgreSQL 15's ``GRANT SET ON PARAMETER``) when a foreign key would fire; and,
once granted, the apply runs as ``replica`` as PostgreSQL's apply worker does.
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


def role_in_a_batch(conn: psycopg.Connection) -> str:
    with conn.transaction():
        replica_role(conn, "apply")
        return conn.execute("SHOW session_replication_role").fetchone()[0]


def test_nothing_fires_differently_no_warning(applier, caplog):
    _, conn = applier
    conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    caplog.set_level(logging.INFO, logger="airflow_provider_rowfilter.subscriber.replica_role")
    assert role_in_a_batch(conn) == "origin"
    assert [r.levelname for r in caplog.records] == ["INFO"], caplog.text
    assert "no trigger or foreign key of the subscriber fires differently" in caplog.text


def test_a_foreign_key_warns_once_with_the_fix_then_the_grant_fixes_it(applier, caplog):
    dsn, conn = applier
    conn.execute("CREATE TABLE parent (id int PRIMARY KEY); "
                 "CREATE TABLE child (id int PRIMARY KEY, p int REFERENCES parent)")
    conn.commit()
    caplog.set_level(logging.INFO, logger="airflow_provider_rowfilter.subscriber.replica_role")
    assert role_in_a_batch(conn) == "origin"
    (record,) = caplog.records
    assert record.levelname == "WARNING" and "\n" not in record.getMessage()
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
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING"], caplog.text
    assert "during this copy of public.child, unlike PostgreSQL's table-sync worker" in caplog.records[1].getMessage()
