"""How far an initial copy is, read from the subscriber while the partitions write: rows, rate, ETA.

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

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from airflow_provider_rowfilter.core.humane import PROGRESS_LOGGER, duration
from airflow_provider_rowfilter.core.relation import TableName

log = logging.getLogger(__name__)
PROGRESS = logging.getLogger(PROGRESS_LOGGER)

#: Seconds between two progress lines (the first after one interval: a short copy says nothing).
DEFAULT_INTERVAL = 10.0

_ROWS = """SELECT coalesce((SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = c.oid), 0)
                + coalesce((SELECT sum(tuples_processed) FROM pg_stat_progress_copy WHERE relid = c.oid), 0)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s"""


def progress_line(table: TableName, rows: int, seconds: float, estimate: int | None) -> str:
    """``public.t: 1,200,000 rows copied in 30.0 s (40,000 rows/s), 60% of ~2,000,000, about 20.0 s left``."""
    rate = rows / seconds if seconds > 0 else 0.0
    line = f"{table}: {rows:,} rows copied in {duration(seconds)} ({rate:,.0f} rows/s)"
    if estimate and estimate > 0:
        share = min(rows / estimate, 1.0)
        line += f", {share:.0%} of ~{estimate:,}"
        if rate > 0 and rows < estimate:
            line += f", about {duration((estimate - rows) / rate)} left"
    return line


@contextmanager
def copy_progress(connect: Callable[[], psycopg.Connection], table: TableName, staging: TableName,
                  estimate: int | None, interval: float = DEFAULT_INTERVAL) -> Iterator[None]:
    """Log the copy's progress into ``staging`` every ``interval`` seconds while the block runs."""
    stop = threading.Event()
    began = time.monotonic()

    def watch() -> None:
        try:
            with connect() as conn:
                conn.execute("SET statement_timeout = '5s'")
                while not stop.wait(interval):
                    try:
                        conn.execute("SELECT pg_stat_clear_snapshot()")
                        row = conn.execute(_ROWS, (staging.schema, staging.name)).fetchone()
                    except psycopg.Error as e:
                        log.debug("progress of %s not read: %s", table, e)
                        continue
                    if row is not None:
                        PROGRESS.info("%s", progress_line(table, int(row[0]), time.monotonic() - began, estimate))
        except Exception as e:  # noqa: BLE001 - progress is an extra: it never fails the copy
            log.debug("progress of %s not reported: %s", table, e)

    thread = threading.Thread(target=watch, name=f"copy-progress-{table}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
