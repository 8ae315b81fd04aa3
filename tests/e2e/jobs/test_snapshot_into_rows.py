"""The initial copy into a table that already has rows, as PostgreSQL's tablesync copies (issue 17, item 4).

PostgreSQL's copy_table runs a plain COPY FROM into the subscriber's table: rows already there stay,
and only a real duplicate key fails the copy. The classic use: regional publishers, each publishing
``WHERE (region = …)``, consolidated into one subscriber table by one subscription each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.flows.drop import drop
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import CopyOptions, sync_tables
from airflow_provider_rowfilter.subscriber.copy_target import check_target, create_staging, staging_table
from airflow_provider_rowfilter.subscriber.state import StateStore
from airflow_provider_rowfilter.tooling.native import NativeSubscription, table_rows
from tests.e2e.jobs.apply_scenario import JOB_TIMEOUT, SPARK_CONF
from tests.e2e.jobs.databases import names
from tests.e2e.jobs.snapshot_scenario import SPLIT, execute

TABLE = "CREATE TABLE t (id int PRIMARY KEY, region text, v int);"
LOCAL = "INSERT INTO t VALUES (1000, 'local', 0), (1001, 'local', 1);"  # the subscriber's own rows


def regional(first: int, region: str) -> str:
    """A regional publisher: ids first..first+99 of both regions, its publication keeps ``region``."""
    # REPLICA IDENTITY FULL: a filter on a non-key column, valid for UPDATE and DELETE too.
    return (TABLE + "ALTER TABLE t REPLICA IDENTITY FULL; "
            f"INSERT INTO t SELECT g, (ARRAY['a', 'b'])[1 + g % 2], g FROM generate_series({first}, {first + 99}) g; "
            f"CREATE PUBLICATION p{region} FOR TABLE t WHERE (region = '{region}');")


def spec_for(publisher: str, subscriber: str, region: str) -> SubscriptionSpec:
    return SubscriptionSpec(subscription=f"into_{region}_{next(names)}", publisher=publisher, subscriber=subscriber,
                            publications=(f"p{region}",))


def state(spec: SubscriptionSpec):
    with psycopg.connect(spec.subscriber, autocommit=True) as conn:
        (rel,) = StateStore(conn, spec.subscription).tables([TableName("public", "t")])
    return rel


@pytest.fixture
def natives():
    made: list[NativeSubscription] = []
    yield made
    for native in made:
        native.drop()


def test_two_regional_publishers_consolidate_into_one_table_beside_native(fresh_db, spark, natives):
    pub_a, pub_b, native, ours = fresh_db(), fresh_db(), fresh_db(), fresh_db()
    execute(pub_a, regional(1, "a"))
    execute(pub_b, regional(101, "b"))
    for subscriber in (native, ours):
        execute(subscriber, TABLE + LOCAL)
    for pub, name in ((pub_a, "pa"), (pub_b, "pb")):
        natives.append(NativeSubscription(pub, native, f"nat_{next(names)}", (name,)).create())

    for spec in (spec_for(pub_a, ours, "a"), spec_for(pub_b, ours, "b")):
        refresh(spec)
        result = sync_tables(spec, spark=spark, options=SPLIT)
        assert result.ok, result.summary()
        assert state(spec).state is SyncState.FINISHED_COPY and state(spec).rows_copied == 50

    rows = table_rows(ours, "t")
    assert rows == table_rows(native, "t")
    assert len(rows) == 102 and "(1000,local,0)" in rows and "(2,a,2)" in rows and "(101,b,101)" in rows


# Several readers stage and move; one reader COPYs straight into the table (jobs/snapshot.py).
PATHS = [pytest.param(SPLIT, id="staged"), pytest.param(CopyOptions(), id="direct")]


@pytest.mark.parametrize("options", PATHS)
def test_a_duplicate_key_fails_the_copy_like_native_and_keeps_the_tables_rows(fresh_db, spark, natives, options):
    pub, native, ours = fresh_db(), fresh_db(), fresh_db()
    execute(pub, regional(1, "a"))
    # Unpublished rows of another region: pages enough for SPLIT's three readers.
    execute(pub, "INSERT INTO t SELECT g, 'c', g FROM generate_series(100000, 101999) g")
    for subscriber in (native, ours):  # id 4 is published (region a) and already in the subscriber
        execute(subscriber, TABLE + LOCAL + "INSERT INTO t VALUES (4, 'local', 4);")
    native_sub = NativeSubscription(pub, native, f"nat_{next(names)}", ("pa",))
    natives.append(native_sub)
    with pytest.raises(TimeoutError):  # native's table sync fails on the key again and again
        native_sub.create(timeout=5)
    assert native_sub.tables() == {"public.t": "d"}
    local = table_rows(ours, "t")
    assert table_rows(native, "t") == local

    spec = spec_for(pub, ours, "a")
    refresh(spec)
    result = sync_tables(spec, spark=spark, options=options)
    (failed,) = result.failed
    assert 'duplicate key value violates unique constraint "t_pkey"' in failed.error
    assert "Key (id)=(4) already exists." in failed.error and "table public.t" in failed.error
    rel = state(spec)
    assert rel.state is SyncState.DATA_COPY and "Key (id)=(4) already exists." in rel.last_error
    assert table_rows(ours, "t") == local  # nothing copied, nothing removed
    with psycopg.connect(ours) as conn:  # and nothing staged is left behind
        assert conn.execute("SELECT to_regclass(%s)", (str(staging_table(spec.subscription, TableName("public", "t"))),)
                            ).fetchone()[0] is None

    # The user removes the local row; the rerun copies, and the table's other rows stay.
    for subscriber in (native, ours):
        execute(subscriber, "DELETE FROM t WHERE id = 4")
    native_sub.wait_synced()
    result = sync_tables(spec, spark=spark, options=options)
    assert result.ok, result.summary()
    assert [t.partitions for t in result.tables] == [1 if options.max_partitions is None else 3]
    assert state(spec).state is SyncState.FINISHED_COPY and state(spec).last_error is None
    assert table_rows(ours, "t") == table_rows(native, "t")
    assert "(1000,local,0)" in table_rows(ours, "t") and len(table_rows(ours, "t")) == 52


def test_a_copy_killed_while_writing_into_the_table_keeps_its_rows_and_the_rerun_copies(fresh_db, spark, tmp_path):
    """The job's one reader COPYs straight into the table (a small table): killed while it waits for the
    table's lock, it leaves the table's own rows, no staging table and state d; the rerun copies."""
    pub, ours = fresh_db(), fresh_db()
    execute(pub, regional(1, "a"))
    execute(ours, TABLE + LOCAL)
    spec = spec_for(pub, ours, "a")
    refresh(spec)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"subscription": spec.subscription, "publisher": pub, "subscriber": ours,
                                    "publications": ["pa"], "spark_master": "local[2]", "spark_conf": SPARK_CONF}))
    staging = str(staging_table(spec.subscription, TableName("public", "t")))
    local = table_rows(ours, "t")

    # A lock on the table holds the job at its COPY into the table; then it is killed.
    with psycopg.connect(ours) as holder:
        holder.execute("LOCK TABLE t IN SHARE MODE")
        job = subprocess.Popen([sys.executable, "-m", "airflow_provider_rowfilter.jobs.snapshot", "--spec", str(path)],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            deadline = time.monotonic() + JOB_TIMEOUT
            with psycopg.connect(ours, autocommit=True) as watch:
                while not watch.execute(
                        "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE NOT l.granted "
                        "AND l.relation = 't'::regclass AND a.application_name LIKE %s)",
                        (f"rowfilter:{spec.subscription}%",)).fetchone()[0]:
                    assert job.poll() is None and time.monotonic() < deadline, job.communicate()
                    time.sleep(0.2)
                assert watch.execute("SELECT to_regclass(%s)", (staging,)).fetchone()[0] is None
                assert watch.execute(
                    "SELECT a.query FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE NOT l.granted "
                    "AND l.relation = 't'::regclass").fetchone()[0].startswith('COPY "public"."t"')
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        holder.rollback()  # the lock goes; the killed job's move must not commit

    assert state(spec).state is SyncState.DATA_COPY
    assert table_rows(ours, "t") == local
    result = sync_tables(spec, spark=spark, options=SPLIT)
    assert result.ok, result.summary()
    with psycopg.connect(pub) as conn:
        published = sorted(r[0] for r in conn.execute("SELECT x::text FROM t x WHERE region = 'a'"))
    assert table_rows(ours, "t") == sorted(local + published)
    assert state(spec).rows_copied == 50


def test_drop_removes_what_a_killed_copy_left_staged(fresh_db, tmp_path):
    pub, ours = fresh_db(), fresh_db()
    execute(pub, regional(1, "a"))
    execute(ours, TABLE + LOCAL)
    spec = spec_for(pub, ours, "a")
    spec = SubscriptionSpec.from_dict({**vars(spec), "change_log": str(tmp_path / "changes")})
    refresh(spec)
    t = TableName("public", "t")
    with psycopg.connect(ours, autocommit=True) as conn:  # what a copy killed in d leaves
        StateStore(conn, spec.subscription).set_state(t, SyncState.DATA_COPY)
        create_staging(conn, check_target(conn, spec.subscription, t, ("id", "region", "v")))
    staging = str(staging_table(spec.subscription, t))
    drop(spec)
    with psycopg.connect(ours) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (staging,)).fetchone()[0] is None
    assert len(table_rows(ours, "t")) == 2  # the table itself is the user's


@pytest.mark.parametrize("options", PATHS)
def test_foreign_keys_and_triggers_do_not_fire_during_the_copy_as_in_table_sync(fresh_db, spark, natives, options):
    """tablesync runs as session_replication_role = replica (worker.c): a child copied before its
    parent's rows arrive takes them, and an ordinary trigger does not fire. Ours, either path, the same."""
    pub, native, ours = fresh_db(), fresh_db(), fresh_db()
    execute(pub, regional(1, "a") + "INSERT INTO t SELECT g, 'c', g FROM generate_series(100000, 101999) g;")
    subscriber_tables = (
        "CREATE TABLE parent (v int PRIMARY KEY); " + TABLE.replace("v int", "v int REFERENCES parent") +
        "CREATE TABLE fired (n int); CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN INSERT INTO fired VALUES (1); RETURN NEW; END$$; "
        "CREATE TRIGGER t_note AFTER INSERT ON t FOR EACH ROW EXECUTE FUNCTION note();")
    for subscriber in (native, ours):
        execute(subscriber, subscriber_tables)  # parent stays empty: every copied v is dangling
    native_sub = NativeSubscription(pub, native, f"nat_{next(names)}", ("pa",))
    natives.append(native_sub)
    native_sub.create()
    native_sub.wait_synced()

    spec = spec_for(pub, ours, "a")
    refresh(spec)
    result = sync_tables(spec, spark=spark, options=options)
    assert result.ok, result.summary()
    assert [t.partitions for t in result.tables] == [1 if options.max_partitions is None else 3]
    assert table_rows(ours, "t") == table_rows(native, "t") and len(table_rows(ours, "t")) == 50
    for subscriber in (native, ours):
        with psycopg.connect(subscriber) as conn:
            assert conn.execute("SELECT count(*) FROM fired").fetchone()[0] == 0
