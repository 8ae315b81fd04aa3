"""Every session pins an empty search_path (connection.py ``open_session``): a role with only CREATE on a database
(tests/attacker.py ``plant_shadows``) that makes the job role's ``$user`` schema and shadows ``=`` and ``substr``
there changes nothing the copy, the apply's Spark judging, the verify or the reconcile read or write, on the
publisher or on the subscriber, and its functions never run; a table it makes there does not take over a name the
publications file leaves unqualified; nor does a spec whose connection asks for another search_path (issue 42).

Each test ends with the control: the same statement in a session that does not pin (psycopg's own, as the job
role) lets every row through and runs the shadow, so the attack was live all along.
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from airflow_provider_rowfilter import connection
from airflow_provider_rowfilter.core.spec.conninfo import PASSWORD_ENV
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import CopyOptions, sync_tables
from airflow_provider_rowfilter.flows.verify import comparison
from airflow_provider_rowfilter.flows.verify.reconcile import reconcile
from airflow_provider_rowfilter.flows.verify.verify import verify
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.attacker import plant_shadows
from tests.e2e.jobs.databases import apply_path, names
from tests.e2e.jobs.snapshot_scenario import execute

TABLE = "CREATE TABLE t9 (id int PRIMARY KEY, v varchar(10));"
#: 3,000 rows, a third of them inside the filter; two pages and more, so that a split copy has two readers.
PUBLISHER = TABLE + ("ALTER TABLE t9 REPLICA IDENTITY FULL; "
                     "INSERT INTO t9 SELECT g, (ARRAY['a', 'b', 'c'])[1 + g % 3] FROM generate_series(1, 3000) g;")
#: Passed by the rows of 'a' only, unless ``=`` or ``substr`` is a shadow.
FILTER = "v = 'a' OR substr(v, 1, 1) = 'x'"
PUBLICATIONS = f"CREATE PUBLICATION p9 FOR TABLE t9 WHERE ({FILTER});\n"


def _spec(tmp_path: Path, publisher: str, subscriber: str, *, source: str = "file", **fields) -> SubscriptionSpec:
    name = f"sp_{next(names)}"
    ddl = None
    if source == "file":
        ddl = tmp_path / f"{name}.sql"
        ddl.write_text(PUBLICATIONS)
    return SubscriptionSpec(subscription=name, publisher=publisher, subscriber=subscriber, publications=("p9",),
                            publications_ddl=None if ddl is None else str(ddl), change_log=str(tmp_path / name),
                            **fields)


def _as_roles(password_roles, monkeypatch, pub: str, sub: str) -> tuple[str, str]:
    """The URLs of ``pub`` and ``sub`` as the run's password roles, their passwords where a job reads them."""
    for role, env in PASSWORD_ENV.items():
        monkeypatch.setenv(env, password_roles[role].password)
    return password_roles["publisher"].url(pub), password_roles["subscriber"].url(sub)


def _inside(dsn: str) -> list[str]:
    """The rows of ``t9`` the filter passes, as pg_catalog's ``=`` and ``substr`` judge them (``table_rows``'s form)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_catalog.set_config('search_path', '', false)")
        return sorted(r[0] for r in conn.execute(f"SELECT x::text FROM public.t9 x WHERE ({FILTER})"))


def _unpinned_count(url: str, password: str, statement: str) -> int:
    """``statement``'s count in a session that does not pin its search_path: the attack's control."""
    with psycopg.connect(url, password=password, autocommit=True) as conn:
        return conn.execute(statement).fetchone()[0]


def test_shadows_in_the_publisher_role_s_schema_change_no_copy_apply_verify_or_reconcile(
        fresh_db, local_pg, password_roles, spark, tmp_path, monkeypatch):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, PUBLISHER)
    execute(sub, TABLE)
    publisher_url, subscriber_url = _as_roles(password_roles, monkeypatch, pub, sub)
    # The job role's "$user" schema, with a t9 of its own that `FOR TABLE t9` must not find.
    shadows = plant_shadows(local_pg, pub, password_roles["publisher"].name, tables=("t9",))
    filtering, engines = apply_path(monkeypatch, "spark")
    spec = _spec(tmp_path, publisher_url, subscriber_url, filtering=filtering)

    # The copy: two readers, Spark tasks, each with its filter on the publisher.
    refresh(spec)
    copied = sync_tables(spec, spark=spark, options=CopyOptions(max_partitions=2, min_pages=1))
    assert copied.ok, copied.summary()
    assert copied.tables[0].table == "public.t9"
    assert copied.tables[0].partitions == 2 and copied.tables[0].rows_copied == 1000
    assert table_rows(sub, "t9") == _inside(pub)

    # The apply: Spark judges the old and the new row of each change by the file's filter.
    execute(pub, "INSERT INTO t9 SELECT g, (ARRAY['a', 'b', 'c'])[1 + g % 3] FROM generate_series(3001, 3030) g; "
                 "UPDATE t9 SET v = 'a' WHERE id IN (1, 2); UPDATE t9 SET v = 'c' WHERE id IN (3, 6); "
                 "DELETE FROM t9 WHERE id IN (9, 10, 11)")
    applied = apply(spec, spark=spark)
    assert applied.drained and applied.changes >= 37
    assert engines["spark"] >= 1 and engines["process"] == 0
    assert table_rows(sub, "t9") == _inside(pub)

    # The verify and the reconcile, on Spark's tasks: a row missing, and one the filter leaves out.
    monkeypatch.setattr(comparison, "LOCAL_PAGES", 0)
    execute(sub, "DELETE FROM t9 WHERE id = 12; INSERT INTO t9 VALUES (100000, 'b')")
    (check,) = verify(spec, spark=spark).tables
    assert (check.missing, check.extra, check.different) == (1, 1, 0), check
    (fixed,) = reconcile(spec, spark=spark).tables
    assert (fixed.inserted, fixed.deleted) == (1, 1), fixed
    assert table_rows(sub, "t9") == _inside(pub)
    assert verify(spec, spark=spark).clean

    assert shadows.ran() == []
    # The control: the job role's own session, unpinned, takes the shadows and lets every row through.
    role = password_roles["publisher"]
    assert _unpinned_count(publisher_url, role.password, f"SELECT count(*) FROM public.t9 WHERE ({FILTER})") == 3027
    assert shadows.ran() and f"ran as {role.name}" in shadows.ran()[0]


def test_a_shadowing_operator_in_the_subscriber_role_s_schema_changes_nothing_the_apply_writes(
        fresh_db, local_pg, password_roles, tmp_path, monkeypatch):
    pub, sub = fresh_db(), fresh_db()
    keyed = "CREATE TABLE k9 (k varchar(10) PRIMARY KEY, n int);"
    execute(pub, keyed + "INSERT INTO k9 SELECT 'k' || g, g FROM generate_series(1, 50) g; "
                         "CREATE PUBLICATION p9 FOR TABLE k9")
    execute(sub, keyed)
    publisher_url, subscriber_url = _as_roles(password_roles, monkeypatch, pub, sub)
    shadows = plant_shadows(local_pg, sub, password_roles["subscriber"].name)
    spec = _spec(tmp_path, publisher_url, subscriber_url, source="catalog")
    refresh(spec)
    assert sync_tables(spec).ok

    # Each key is matched with varchar = varchar: a shadow that says true would update or delete every row.
    execute(pub, "UPDATE k9 SET n = n + 100 WHERE k = 'k7'; DELETE FROM k9 WHERE k = 'k8'; "
                 "INSERT INTO k9 VALUES ('k51', 51); UPDATE k9 SET k = 'k60' WHERE k = 'k9'")
    apply(spec)
    assert table_rows(sub, "k9") == table_rows(pub, "k9")
    assert len(table_rows(sub, "k9")) == 50
    assert verify(spec).clean

    assert shadows.ran() == []
    role = password_roles["subscriber"]
    assert _unpinned_count(subscriber_url, role.password, "SELECT count(*) FROM public.k9 WHERE k = 'k1'") == 50
    assert shadows.ran() and f"ran as {role.name}" in shadows.ran()[0]


@pytest.mark.parametrize("source", ["file", "catalog"])
def test_a_spec_asking_for_another_search_path_is_still_pinned(fresh_db, local_pg, password_roles, tmp_path,
                                                                 monkeypatch, caplog, source):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, PUBLISHER + ("" if source == "file" else PUBLICATIONS))
    execute(sub, TABLE)
    publisher_url, subscriber_url = _as_roles(password_roles, monkeypatch, pub, sub)
    evil = f"{publisher_url}?options={quote('-c search_path=evil,public')}"
    shadows = plant_shadows(local_pg, pub, "evil")
    spec = _spec(tmp_path, evil, subscriber_url, source=source)
    monkeypatch.setattr(connection, "_WARNED", set())  # said once per process and options string
    with caplog.at_level(logging.WARNING, logger="airflow_provider_rowfilter.connection"):
        refresh(spec)
        copied = sync_tables(spec)  # one reader, in this process
    assert copied.ok, copied.summary()
    assert table_rows(sub, "t9") == _inside(pub)
    assert (check := verify(spec)).clean, check.tables
    assert shadows.ran() == []
    warned = [r for r in caplog.records if "set search_path: ignored" in r.getMessage()]
    assert len(warned) == 1 and "evil" not in warned[0].getMessage()

    role = password_roles["publisher"]
    assert _unpinned_count(evil, role.password, f"SELECT count(*) FROM public.t9 WHERE ({FILTER})") == 3000
    assert shadows.ran()
