"""A writer of an abandoned copy attempt writes nothing once a new attempt has started."""

from __future__ import annotations

import psycopg
import pytest

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.subscriber.copy_target import (
    CopyFence,
    CopySupersededError,
    fence_copies,
    write_copy,
)
from airflow_provider_rowfilter.subscriber.state import StateStore, migrate

T = TableName("public", "t")


def token(conn) -> str:
    return conn.execute("SELECT updated_at::text FROM rowfilter.subscription_rel WHERE table_name = 't'").fetchone()[0]


def test_a_superseded_writer_is_refused_and_the_current_one_writes(fresh_db):
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        migrate(conn)
        store = StateStore(conn, "s")
        store.ensure_subscription(["p"], "slot", "pub")
        store.reconcile([T], copy_data=True, current_lsn="0/0")
        store.set_state(T, SyncState.DATA_COPY)
        old = CopyFence("s", "public", "t", token(conn))
        with conn.transaction():  # a rerun: fence, truncate, d again (a new updated_at)
            fence_copies(conn, old.lock_key)
            conn.execute("TRUNCATE t")
            store.set_state(T, SyncState.DATA_COPY)
        new = CopyFence("s", "public", "t", token(conn))
    assert new.token != old.token
    with pytest.raises(CopySupersededError, match="superseded"):
        write_copy({"conninfo": dsn}, "COPY public.t (id) FROM STDIN", iter([b"1\n2\n"]), old)
    assert write_copy({"conninfo": dsn}, "COPY public.t (id) FROM STDIN", iter([b"1\n", b"2\n"]), new) == 2
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT array_agg(id ORDER BY id) FROM t").fetchone()[0] == [1, 2]
