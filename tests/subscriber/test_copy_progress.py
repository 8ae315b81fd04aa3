"""The copy's progress, read from PostgreSQL's own counters while rows arrive (a real subscriber)."""

from __future__ import annotations

import logging
import time

import psycopg

from airflow_provider_rowfilter.connection import connect, in_task
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.humane import PROGRESS_LOGGER
from airflow_provider_rowfilter.subscriber.copy_progress import copy_progress, copy_report


def test_a_copy_report_line_says_rows_rate_share_and_time_left() -> None:
    table = TableName("public", "t")
    assert copy_report(table, 1_200_000, 30.0, 2_000_000).line == (
        "public.t: 1,200,000 rows copied in 30.0 s (40,000 rows/s), 60% of ~2,000,000, about 20.0 s left")
    assert copy_report(table, 500, 2.0, None).line == "public.t: 500 rows copied in 2.0 s (250 rows/s)"
    assert copy_report(table, 0, 0.0, 10).line == "public.t: 0 rows copied in 0 ms (0 rows/s), 0% of ~10"


def test_progress_counts_the_rows_committed_into_the_staging_table(fresh_db, caplog) -> None:
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE staged (id int)")
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)
    with copy_progress(lambda: psycopg.connect(dsn, autocommit=True), TableName("public", "t"),
                       TableName("public", "staged"), 4000, interval=0.2):
        with psycopg.connect(dsn, autocommit=True) as writer:
            with writer.cursor().copy("COPY staged (id) FROM STDIN") as copy:
                for i in range(3000):
                    copy.write_row((i,))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any("3,000 rows copied" in r.getMessage() for r in caplog.records):
            time.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records if r.name == PROGRESS_LOGGER]
    assert any(line.startswith("public.t: 3,000 rows copied in ") and "75% of ~4,000" in line for line in lines), lines


def test_the_progress_thread_connects_with_the_passwords_handed_to_the_task(fresh_db, caplog, password_roles) -> None:
    """Issue 29, item 1: the passwords an operator's task hands the job's code (connection.py ``in_task``) are a
    context variable; the thread that reads the progress runs in the caller's context, so it connects too."""
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE staged (id int)")
    role = password_roles["subscriber"]
    spec = SubscriptionSpec(subscription="s1", publications=("p1",), subscriber=role.url(dsn))
    caplog.set_level(logging.DEBUG)
    with in_task({"subscriber": role.password}), copy_progress(
            lambda: connect(spec.subscriber, "subscriber", spec), TableName("public", "t"),
            TableName("public", "staged"), None, interval=0.1):
        with psycopg.connect(dsn, autocommit=True) as writer:
            writer.execute("INSERT INTO staged SELECT g FROM generate_series(1, 500) g")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any("500 rows copied" in r.getMessage() for r in caplog.records):
            time.sleep(0.1)
    assert any("500 rows copied" in r.getMessage() for r in caplog.records if r.name == PROGRESS_LOGGER), \
        [r.getMessage() for r in caplog.records]


def test_a_copy_straight_into_the_table_counts_its_own_rows_only(fresh_db, caplog) -> None:
    """A copy of one reader writes into the table itself (jobs/snapshot.py): the table's earlier
    inserts (100,000 here, in pg_stat_user_tables) and another session's COPY into it (20,000) are
    not the copy's."""
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int); INSERT INTO t SELECT g FROM generate_series(1, 100000) g")
    with psycopg.connect(dsn, autocommit=True) as conn:  # the inserting backend has flushed its counts
        deadline = time.monotonic() + 15
        while conn.execute("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 't'").fetchone()[0] < 100000:
            assert time.monotonic() < deadline
            time.sleep(0.2)
            conn.execute("SELECT pg_stat_clear_snapshot()")
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)
    table = TableName("public", "t")
    with psycopg.connect(dsn) as writer, psycopg.connect(dsn) as other:
        with other.cursor().copy("COPY t (id) FROM STDIN") as other_copy:  # another session's COPY into t
            for i in range(20000):
                other_copy.write_row((i,))
            with copy_progress(lambda: psycopg.connect(dsn, autocommit=True), table, table, None, interval=0.2,
                               writer_pid=writer.info.backend_pid):
                with writer.cursor().copy("COPY t (id) FROM STDIN") as copy:
                    for i in range(30000):
                        copy.write_row((i,))
                    deadline = time.monotonic() + 30  # the COPY is still open: what reached the server counts
                    while time.monotonic() < deadline and not any(n > 0 for n in _counts(caplog)):
                        time.sleep(0.2)  # a reading before the server processed a row says 0 (under load)
    counts = _counts(caplog)
    assert counts and max(counts) > 0 and all(0 <= n <= 30000 for n in counts), counts


def _counts(caplog) -> list[int]:
    return [int(r.getMessage().split(" rows copied")[0].split(": ")[1].replace(",", ""))
            for r in list(caplog.records) if r.name == PROGRESS_LOGGER]
