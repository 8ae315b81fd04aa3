"""connection.py: every session of ours is opened by ``open_session`` (or its async twin) and runs with an empty
search_path, whatever its connection string, ``PGOPTIONS`` or the role's settings ask for; no other module of the
package opens one (the test tooling aside: tooling/ sets up the local clusters, the native referee and the demo's
own databases, as their superuser)."""

from __future__ import annotations

import ast
import asyncio
import logging
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from airflow_provider_rowfilter import connection
from airflow_provider_rowfilter.connection import connect, open_async_session, open_session
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.subscriber.copy_target import executor_conninfo

PACKAGE = Path(connection.__file__).parent
#: Where a connection may be made: the funnel itself, and the test tooling (not part of any job or operator).
ALLOWED = (PACKAGE / "connection.py", PACKAGE / "tooling")
EVIL = "-c search_path=evil,public"


def _connects(tree: ast.AST) -> list[int]:
    """The lines of ``tree`` that open a connection with psycopg's own calls (``psycopg.connect``,
    ``[Async]Connection.connect``, ``from psycopg import connect``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "psycopg" and any(a.name == "connect" for a in node.names):
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "connect":
            owner = ast.unparse(node.func.value)
            if owner in ("psycopg", "psycopg.Connection", "psycopg.AsyncConnection", "Connection", "AsyncConnection"):
                lines.append(node.lineno)
    return lines


def test_no_module_but_the_funnel_opens_a_connection():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             if not any(path == a or a in path.parents for a in ALLOWED)
             for line in _connects(ast.parse(path.read_text(), str(path)))]
    assert found == []


@pytest.mark.parametrize("code", ["psycopg.connect(url)", "psycopg.AsyncConnection.connect(url)",
                                  "from psycopg import connect", "await AsyncConnection.connect(url, autocommit=True)"])
def test_the_guard_catches_each_way_of_connecting(code):
    assert _connects(ast.parse(f"async def f():\n    {code}")) == [2]


def _path(conn: psycopg.Connection) -> str:
    return conn.execute("SELECT pg_catalog.current_setting('search_path')").fetchone()[0]


def test_a_session_is_pinned_whatever_its_options_ask(fresh_db, monkeypatch, caplog):
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        database = conn.info.dbname
        conn.execute(f'ALTER DATABASE "{database}" SET search_path = evil, public')
    monkeypatch.setattr(connection, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger=connection.__name__):
        with open_session(dsn) as conn:  # the database's own setting
            assert _path(conn) == "" and conn.autocommit
        with open_session(dsn, options=EVIL) as conn:  # the connection string's options
            assert _path(conn) == ""
        with open_session(dsn, options=EVIL) as conn:
            assert _path(conn) == ""
        monkeypatch.setenv("PGOPTIONS", "-c search_path=elsewhere")
        with open_session(dsn) as conn:
            assert _path(conn) == ""
    # Once per options string and process: the request has no effect, and is named, not quoted.
    warned = [r.getMessage() for r in caplog.records if "set search_path: ignored" in r.getMessage()]
    assert len(warned) == 2 and not any("evil" in w or "elsewhere" in w for w in warned)
    monkeypatch.delenv("PGOPTIONS")

    # A session left in a transaction (the Spark tasks' readers and writers): the pin was committed before it
    # began, so a rollback does not undo it; a replication=database session (the copy's slot, the capture's
    # checks) is pinned as libpqrcv_connect pins its own.
    conn = open_session(dsn, autocommit=False)
    try:
        assert not conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert _path(conn) == ""
        conn.rollback()
        assert _path(conn) == ""
    finally:
        conn.close()
    with open_session(dsn, replication="database") as conn:
        assert _path(conn) == ""

    async def read() -> str:
        async with await open_async_session(dsn, options=EVIL) as aconn:
            return (await (await aconn.execute("SHOW search_path")).fetchone())[0]
    assert asyncio.run(read()) == ""


def test_every_way_in_pins(fresh_db, password_roles, monkeypatch):
    """The spec's connection (the jobs, the CLI), the executors' parameters (Spark's tasks) and an Airflow
    connection's endpoint (operators, hooks, the sensor, the page): each with a search_path asked for."""
    from airflow_provider_rowfilter.hooks.rowfilter import Endpoint, ResolvedSpec

    role = password_roles["subscriber"]
    url = f"{role.url(fresh_db())}?options={quote(EVIL)}"
    monkeypatch.setenv("ROWFILTER_SUBSCRIBER_PASSWORD", role.password)
    spec = SubscriptionSpec(subscription="s", publisher=url, subscriber=url, publications=("p",))
    with connect(url, "subscriber", spec) as conn:
        assert _path(conn) == "" and conn.info.user == role.name
    with open_session(autocommit=False, **executor_conninfo(url, "subscriber", "rowfilter:test")) as conn:
        assert _path(conn) == ""
    endpoint = Endpoint("sub", url, role.password, "subscriber")
    with endpoint.connect(connect_timeout=5) as conn:
        assert _path(conn) == ""
    with ResolvedSpec(spec, {"subscriber": endpoint}).connect("subscriber") as conn:
        assert _path(conn) == ""
