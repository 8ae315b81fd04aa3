"""The state module: the only home of statements on schema ``rowfilter``; its reader, blocking and async."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import psycopg
import pytest

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.subscriber.state import (
    AsyncStateReader,
    BatchRecord,
    RefreshRecord,
    StateError,
    StateReader,
    StateStore,
    migrate,
)

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_rowfilter"
T1, T2 = TableName("public", "t1"), TableName("sales", "t2")
# The state module and its parts; and the apply's scratch table, which the apply alone reads and writes.
STATE_MODULES = {"subscriber/state.py", "subscriber/state_migrations.py", "subscriber/state_reader.py",
                 "subscriber/conflicts.py"}
STAGE_MODULES = {"subscriber/apply_target.py", "subscriber/apply_stage.py"}
_STATEMENT = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN|TABLE|EXISTS)\s+rowfilter\.(\w+)|to_regclass\('rowfilter\.(\w+)")


def test_every_statement_on_schema_rowfilter_is_in_the_state_module() -> None:
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in STATE_MODULES:
            continue
        text = path.read_text()
        for match in _STATEMENT.finditer(text):
            table = match.group(1) or match.group(2)
            if not (table == "apply_stage" and name in STAGE_MODULES):
                outside.append(f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}")
        if "{SCHEMA}" in text:
            outside.append(f"{name}: {{SCHEMA}}")
    assert outside == []


def _state(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        store = StateStore(conn, "s1")
        with conn.transaction():
            store.ensure_subscription(["p1", "p2"], "slot_s1", "pub_s1", {"copy_data": True})
            store.reconcile([T1, T2], copy_data=True, current_lsn="0/0")
            store.record_refresh("0/10", [T1, T2], [], {"public.t1": {"insert": "a > 1"}})
        with conn.transaction():
            store.set_state(T1, SyncState.DATA_COPY)
            store.set_state(T1, SyncState.FINISHED_COPY, lsn="0/20", rows_copied=7)
        with conn.transaction():
            store.lock_tables()
            store.set_state(T1, SyncState.SYNCHRONIZED, lsn="0/20")
            store.set_state(T1, SyncState.READY, lsn="0/30")
            first = store.record_batch(start_lsn="0/20", end_lsn="0/30", counts={"public.t1": {"insert": 2}},
                                       duration_ms=5, transactions=1, changes=2, skipped_lsn=None,
                                       lag_bytes=16, lag_seconds=0.5)
        with conn.transaction():
            store.record_batch(start_lsn="0/30", end_lsn="0/40", counts={}, duration_ms=1, transactions=0,
                               changes=0, skipped_lsn="0/38", lag_bytes=None, lag_seconds=None)
        store.record_error(T2, "boom")
    assert first > 0


def _read_only(dsn: str) -> psycopg.Connection:
    """A session that cannot write: every read of the reader must still work in it."""
    return psycopg.connect(dsn, autocommit=True, options="-c default_transaction_read_only=on")


def test_the_reader_reads_what_the_store_wrote_in_a_read_only_session(fresh_db: Callable[..., str]) -> None:
    dsn = fresh_db()
    _state(dsn)
    with _read_only(dsn) as conn:
        reader = StateReader(conn, "s1")
        row = reader.require_subscription()
        assert (row.publications, row.slot_name, row.options, row.applied_lsn, row.skip_lsn, row.last_error) == (
            ["p1", "p2"], "slot_s1", {"copy_data": True}, "0/40", None, None)
        tables = reader.tables()
        assert [(r.table, r.state, r.lsn, r.rows_copied, r.last_error) for r in tables] == [
            (T1, SyncState.READY, "0/30", 7, None), (T2, SyncState.INIT, None, None, "boom")]
        assert reader.tables([T2]) == tables[1:]
        batches = reader.batches_after(0)
        assert [(b.start_lsn, b.end_lsn, b.skipped_lsn, b.counts) for b in batches] == [
            ("0/30", "0/40", "0/38", {}), ("0/20", "0/30", None, {"public.t1": {"insert": 2}})]
        assert isinstance(batches[0], BatchRecord) and reader.last_batch() == batches[0]
        assert reader.last_batch_id() == batches[0].id and reader.batches_after(batches[0].id) == []
        assert reader.batches_after(batches[1].id) == batches[:1]
        (refresh,) = reader.refreshes()
        assert isinstance(refresh, RefreshRecord)
        assert (refresh.lsn, refresh.added, refresh.removed) == ("0/10", ["public.t1", "sales.t2"], [])
        assert reader.last_refresh() == refresh and reader.last_refresh_id() == refresh.id
        assert reader.refreshes(after_id=refresh.id) == []
        assert reader.copy_token(T1) is not None and reader.copy_token(T1, SyncState.DATA_COPY) is None
        assert reader.copy_token(TableName("public", "nope")) is None
        reading = reader.read_state()
    assert (reading.exists, reading.row, reading.tables) == (True, row, tuple(tables))
    assert asdict(reading)["row"]["name"] == "s1"  # plain dataclasses all the way down


def test_the_async_reader_returns_what_the_blocking_one_does(fresh_db: Callable[..., str]) -> None:
    dsn = fresh_db()
    _state(dsn)

    async def read(subscription: str):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                         options="-c default_transaction_read_only=on") as conn:
            return await AsyncStateReader(conn, subscription).read_state()

    with _read_only(dsn) as conn:
        for name in ("s1", "other"):
            assert asyncio.run(read(name)) == StateReader(conn, name).read_state()
    assert asyncio.run(read("other")).exists is False


def test_a_subscriber_without_the_schema_has_no_state(fresh_db: Callable[..., str]) -> None:
    dsn = fresh_db()
    with _read_only(dsn) as conn:
        reader = StateReader(conn, "s1")
        assert reader.subscription_row() is None
        assert reader.read_state().exists is False and reader.read_state().tables == ()
        assert (reader.last_batch_id(), reader.last_refresh_id()) == (0, 0)
        with pytest.raises(StateError, match="subscription 's1' has no state in the subscriber") as e:
            reader.require_subscription()
    assert "rowfilter refresh" in e.value.hint
