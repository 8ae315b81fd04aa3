"""How far a table synchronization's copy is, read from the subscriber while the partitions write: rows, rate, ETA.

The partitions write into the copy's staging table (subscriber/copy_target.py) on the executors;
the driver sees none of it. PostgreSQL does: ``pg_stat_progress_copy`` counts the tuples of every
COPY in progress (PostgreSQL 14+; src/backend/commands/copyfrom.c reports ``tuples_processed``),
and ``pg_stat_user_tables.n_tup_ins`` those of the partitions that finished (their backends flushed
their statistics when they ended). Their sum, read every ``interval`` seconds by a thread of its
own on a connection of its own, is logged with the rate and, when the publisher's estimate of the
rows to copy is known (an unfiltered table: ``pg_class.reltuples``), the share and the time left.
A reading that fails is skipped: progress never fails a copy.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.humane import ProgressReport, duration, report_progress

log = logging.getLogger(__name__)

#: Seconds between two progress lines (the first after one interval: a short copy says nothing).
DEFAULT_INTERVAL = 10.0

_ROWS = """SELECT coalesce((SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = c.oid), 0)
                + coalesce((SELECT sum(tuples_processed) FROM pg_stat_progress_copy WHERE relid = c.oid), 0)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s"""
# A copy straight into the table (one reader, flows/table_sync/table_copy.py): only its own COPY counts (its backend's);
# the table's earlier inserts, and another session's COPY into it, are not the copy's.
_ROWS_OF_ONE_COPY = """SELECT coalesce((SELECT sum(tuples_processed) FROM pg_stat_progress_copy
                                       WHERE relid = c.oid AND pid = %s), 0)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s"""


def copy_report(table: TableName, rows: int, seconds: float, estimate: int | None, *,
                final: bool = False) -> ProgressReport:
    """The copy of ``table`` after ``seconds``: its log line (``public.t: 1,200,000 rows copied in 30.0 s
    (40,000 rows/s), 60% of ~2,000,000, about 20.0 s left``), and its bar (``rows`` of the estimate, when
    known). ``final``: the copy is done and ``rows`` is what it copied (the bar completes)."""
    rate = rows / seconds if seconds > 0 else 0.0
    line = f"{table}: {rows:,} rows copied in {duration(seconds)} ({rate:,.0f} rows/s)"
    detail = f"{rows:,} rows, {rate:,.0f} rows/s"
    if final:
        return ProgressReport("copy", str(table), rows, rows, f"{detail}, done in {duration(seconds)}",
                              line, final=True)
    if estimate and estimate > 0:
        share = min(rows / estimate, 1.0)
        line += f", {share:.0%} of ~{estimate:,}"
        detail = f"{rows:,} of ~{estimate:,} rows, {rate:,.0f} rows/s"
        if rate > 0 and rows < estimate:
            left = f"about {duration((estimate - rows) / rate)} left"
            line, detail = f"{line}, {left}", f"{detail}, {left}"
    return ProgressReport("copy", str(table), rows, estimate if estimate and estimate > 0 else None,
                          detail, line)


def copy_done(table: TableName, rows: int, seconds: float) -> None:
    """Report the end of the copy of ``table`` (at DEBUG: a bar completes, a log says nothing more)."""
    report_progress(copy_report(table, rows, seconds, None, final=True))


def copy_failed(table: TableName) -> None:
    """Report that the copy of ``table`` failed (at DEBUG: its bar says so, at its last reading, which counted
    rows since rolled back; a log has the error already)."""
    report_progress(ProgressReport.failed("copy", str(table)))


@contextmanager
def copy_progress(connect: Callable[[], psycopg.Connection], table: TableName, staging: TableName,
                  estimate: int | None, interval: float = DEFAULT_INTERVAL, *,
                  writer_pid: int | None = None) -> Iterator[None]:
    """Log the copy's progress into ``staging`` every ``interval`` seconds while the block runs.

    ``writer_pid``: the copy is one COPY into ``table`` itself (``staging`` is ``table``) by the
    backend with that pid, and only its tuples count."""
    query, params = (_ROWS, ()) if writer_pid is None else (_ROWS_OF_ONE_COPY, (writer_pid,))
    stop = threading.Event()
    began = time.monotonic()

    def watch() -> None:
        try:
            with connect() as conn:
                conn.execute("SET statement_timeout = '5s'")
                while not stop.wait(interval):
                    try:
                        conn.execute("SELECT pg_stat_clear_snapshot()")
                        row = conn.execute(query, (*params, staging.schema, staging.name)).fetchone()
                    except psycopg.Error as e:
                        log.debug("progress of %s not read: %s", table, e)
                        continue
                    if row is not None:
                        report_progress(copy_report(table, int(row[0]), time.monotonic() - began, estimate))
        except Exception as e:  # progress is an extra: it never fails the copy
            log.debug("progress of %s not reported: %s", table, e)

    # In the caller's context: the passwords connection.py ``in_task`` handed it are a context variable.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(watch,), name=f"copy-progress-{table}",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
