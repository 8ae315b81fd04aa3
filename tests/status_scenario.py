"""A subscription whose status has it all: a long table name, a batch 20 minutes old, a table reset since, an error.

Made through the state store on a real subscriber (no Spark): ``rowfilter status`` and the apply task's
summary read it as they read any subscription.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import yaml

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.subscriber.state import StateStore

LONG = "customer_order_line_items_archive_2024"
SCHEMA = f"""
CREATE TABLE {LONG} (id int PRIMARY KEY, note text);
ALTER TABLE {LONG} REPLICA IDENTITY FULL;
CREATE TABLE t2 (id int PRIMARY KEY);
CREATE PUBLICATION pub_with_a_rather_long_name FOR TABLE {LONG} WHERE (id > 5 AND note <> 'a fairly long literal'),
  t2;
"""
ERROR = "duplicate key value violates unique constraint \"t2_pkey\"\nDETAIL:  Key (id)=(7) already exists."



def status_scenario(fresh_db: Callable[[], str], tmp_path: Path) -> tuple[str, str]:
    """A subscription with one table ready after a batch 20 minutes ago, one reset to ``i`` since, and an error."""
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(SCHEMA)
    with psycopg.connect(sub, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {LONG} (id int PRIMARY KEY, note text); CREATE TABLE t2 (id int PRIMARY KEY);")
    path = tmp_path / "s1.yaml"
    path.write_text(yaml.safe_dump({"subscription": "s1", "publisher": pub, "subscriber": sub,
                                    "publications": ["pub_with_a_rather_long_name"],
                                    "change_log": str(tmp_path / "changes")}))
    assert cli.main(["refresh", "--spec", str(path)]) == 0
    with psycopg.connect(pub, autocommit=True) as conn:
        lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        conn.execute("INSERT INTO t2 SELECT generate_series(1, 20000)")  # the tables are behind now
    long, t2 = TableName("public", LONG), TableName("public", "t2")
    with psycopg.connect(sub) as conn:
        store = StateStore(conn, "s1")
        for table in (long, t2):
            store.set_state(table, SyncState.DATA_COPY)
            store.set_state(table, SyncState.FINISHED_COPY, lsn=lsn, rows_copied=1234567)
            store.set_state(table, SyncState.SYNCHRONIZED, lsn=lsn)
            store.set_state(table, SyncState.READY, lsn=lsn)
        store.record_batch(start_lsn=lsn, end_lsn=lsn, counts={str(long): {"insert": 3, "skipped": 2},
                                                              str(t2): {"insert": 9}},
                           duration_ms=11852, transactions=2, changes=14, skipped_lsn=None, lag_bytes=0,
                           lag_seconds=11.852699)
        conn.execute("UPDATE rowfilter.batch_history SET finished_at = now() - interval '20 minutes'")
        conn.commit()
        store.set_state(t2, SyncState.INIT, resync=True)  # `rowfilter resync`: its counts are an older life
        conn.commit()
    StateStore(psycopg.connect(sub, autocommit=True), "s1").record_error(long, ERROR)
    return str(path), lsn
