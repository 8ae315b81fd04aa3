"""subscriber/state_migrations.py ``migrate``: schema ``rowfilter`` made first by a role with CREATE on the subscriber's
database (it would own the state's tables' schema, and could drop and replace them) is refused, nothing created in
it; one owned by the job's role, a role it belongs to, or a superuser is used."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from airflow_provider_rowfilter.connection import open_session
from airflow_provider_rowfilter.subscriber.state_migrations import MIGRATIONS, migrate
from airflow_provider_rowfilter.subscriber.state_reader import StateError
from tests.attacker import SQUATTER

GROUP = "rf_test_state_owners"
MEMBER = "rf_test_state_member"


def _superuser(dsn: str, text: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(text)


@pytest.fixture
def roles(local_pg):
    """A login role that is not a superuser (:data:`MEMBER`), a member of :data:`GROUP`; and the squatter."""
    local_pg.create_role(MEMBER, "member-password")
    with psycopg.connect(local_pg.dsn(), autocommit=True) as conn:
        for role in (GROUP, SQUATTER):
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(GROUP), sql.Identifier(MEMBER)))


def _member(local_pg, dsn: str) -> psycopg.Connection:
    database = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    return open_session(local_pg.role_dsn(MEMBER, str(database)), password="member-password")


@pytest.mark.parametrize("owner", [SQUATTER, GROUP, MEMBER, "postgres"])
def test_a_schema_made_by_someone_else_is_used_only_if_its_owner_is_trusted(fresh_db, local_pg, roles, owner):
    dsn = fresh_db()
    database = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    _superuser(dsn, sql.SQL("GRANT CREATE ON DATABASE {d} TO {s}, {m}; "
                            "CREATE SCHEMA rowfilter AUTHORIZATION {o}; GRANT ALL ON SCHEMA rowfilter TO PUBLIC").format(
        d=sql.Identifier(str(database)), s=sql.Identifier(SQUATTER), m=sql.Identifier(MEMBER),
        o=sql.Identifier(owner)).as_string(None))
    with _member(local_pg, dsn) as conn:
        if owner == SQUATTER:
            with pytest.raises(StateError, match=f'(?s)owned by role "{SQUATTER}".*ALTER SCHEMA rowfilter OWNER TO'):
                migrate(conn)
            assert conn.execute("SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                                "ON n.oid = c.relnamespace WHERE n.nspname = 'rowfilter'").fetchone() == (0,)
        else:
            assert migrate(conn) == max(v for v, _ in MIGRATIONS)
            assert conn.execute("SELECT count(*) FROM rowfilter.schema_version").fetchone()[0] == len(MIGRATIONS)


def test_a_superuser_job_role_refuses_the_squatter_s_schema_too(fresh_db, roles):
    dsn = fresh_db()
    _superuser(dsn, sql.SQL("CREATE SCHEMA rowfilter AUTHORIZATION {}").format(sql.Identifier(SQUATTER)).as_string(None))
    with open_session(dsn) as conn, pytest.raises(StateError, match="nor a superuser"):
        migrate(conn)
