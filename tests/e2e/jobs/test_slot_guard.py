"""The slot guard's run (flows/slot_guard.py) on real PostgreSQL: it reads the slot into the change log, applying nothing;
the next apply applies what it kept, once; it never captures into a log the apply does not read, nor beside a
running apply. (With a real scheduler, paused past idle_replication_slot_timeout: tests/e2e/airflow/test_slot_guard.py.)"""

from __future__ import annotations

import dataclasses

import psycopg
import yaml

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.slot_guard import guard_slot
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.tooling.native import table_rows

TABLE = "CREATE TABLE t (id int PRIMARY KEY, v int); ALTER TABLE t REPLICA IDENTITY FULL;"


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def confirmed(pub: str) -> str:
    with psycopg.connect(pub) as conn:
        return conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                            "WHERE slot_name = 'rowfilter_guard1'").fetchone()[0]


def test_the_guard_keeps_the_slot_moving_and_the_apply_applies_it_once(fresh_db, tmp_path):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, TABLE, "INSERT INTO t SELECT g, g FROM generate_series(1, 50) g",
            "CREATE PUBLICATION p FOR TABLE t WHERE (v % 2 = 0)")
    execute(sub, TABLE)
    path = tmp_path / "guard1.yaml"
    path.write_text(yaml.safe_dump({"subscription": "guard1", "publisher": pub, "subscriber": sub,
                                    "publications": ["p"], "change_log": str(tmp_path / "log")}))
    spec = SubscriptionSpec.load(path)
    refresh(spec)
    assert sync_tables(spec).ok
    apply(spec)
    before = table_rows(sub, "t")
    execute(pub, "INSERT INTO t SELECT g, g FROM generate_series(51, 80) g", "DELETE FROM t WHERE id = 2",
            "UPDATE t SET v = v + 1 WHERE id = 3")

    elsewhere = guard_slot(dataclasses.replace(spec, change_log=str(tmp_path / "another")))
    assert elsewhere.skipped and "is not the one the subscriber records" in elsewhere.skipped, elsewhere
    assert not (tmp_path / "another").exists() or not any((tmp_path / "another").iterdir())
    held = confirmed(pub)
    with psycopg.connect(sub, autocommit=True) as other:  # an apply runs: it reads the slot itself
        other.execute("SELECT pg_advisory_lock(hashtext('rowfilter:guard1'), hashtext('apply'))")
        busy = guard_slot(spec)
    assert busy.skipped == "an apply of the subscription runs: it reads the slot itself" and confirmed(pub) == held

    guarded = guard_slot(spec)
    assert guarded.skipped is None and guarded.caught_up and guarded.changes == 17, guarded.summary()
    assert confirmed(pub) != held and table_rows(sub, "t") == before  # the slot moved on; nothing applied
    assert "17 change(s) in 3 transaction(s) kept in the change log" in guarded.describe()
    again = guard_slot(spec)  # nothing new: the slot is read all the same (its inactive_since starts again)
    assert again.skipped is None and again.changes == 0

    result = apply(spec)
    with psycopg.connect(pub) as conn:
        expected = sorted(r[0] for r in conn.execute("SELECT x::text FROM t x WHERE v % 2 = 0"))
    assert table_rows(sub, "t") == expected and result.changes == 17
