"""The verify and reconcile tests' scenario: a publisher, our subscriber, native subscriptions as referees.

Shared by tests/e2e/jobs/test_verify.py, test_reconcile.py, test_reconcile_referee.py and test_reconcile_faults.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import yaml
from psycopg import sql

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from tests.e2e.jobs.databases import names


def execute(dsn: str, text: str, params: tuple = ()) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(text, params or None)


def spec_file(tmp_path: Path, publisher: str, subscriber: str, publications: list[str], **extra) -> tuple[Path, SubscriptionSpec]:
    """A spec file of a new subscription of ours (the command line reads it) and the spec it loads to."""
    name = f"ver_{next(names)}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"subscription": name, "publisher": publisher, "subscriber": subscriber,
                                    "publications": publications, "change_log": str(tmp_path / name), **extra}))
    return path, SubscriptionSpec.load(path)


def keyed_rows(dsn: str, table: str, key: str) -> dict[str, str]:
    """``key text -> row text`` of every row."""
    schema, _, name = table.rpartition(".")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT ROW({k})::text, x::text FROM {t} x").format(
            k=sql.Identifier(key), t=sql.Identifier(schema or "public", name))).fetchall()
    return dict(rows)


def expected_diff(ours: dict[str, str], fresh: dict[str, str]) -> tuple[int, int, int]:
    """``(missing, extra, different)`` of ``ours`` against a fresh copy's rows, by key: what a verify must report."""
    missing = len(set(fresh) - set(ours))
    extra = len(set(ours) - set(fresh))
    different = sum(1 for k in set(ours) & set(fresh) if ours[k] != fresh[k])
    return missing, extra, different


class LiveWriter:
    """Publisher transactions in a thread, until stopped: inserts, updates and deletes of table ``t``
    (``id int PRIMARY KEY, grp int, v text``) on keys of its own."""

    def __init__(self, dsn: str, start: int = 1_000_000) -> None:
        self.dsn, self.next = dsn, start
        self.stop_event = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    k = self.next
                    self.next += 3
                    with conn.transaction():
                        conn.execute("INSERT INTO t VALUES (%s, %s, 'live'), (%s, %s, 'live')", (k, k % 10, k + 1, k % 10))
                        conn.execute("UPDATE t SET v = v || '+', grp = (grp + 1) %% 10 WHERE id IN (%s, %s)",
                                     (k - 3, (k * 7) % 1000 + 1))
                        conn.execute("DELETE FROM t WHERE id = %s", (k - 5,))
                    self.transactions += 1
                    time.sleep(0.01)
        except BaseException as e:  # reported by stop()
            self.error = e

    def stop(self) -> int:
        self.stop_event.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error
        return self.transactions


@contextmanager
def live_changes(dsn: str, start: int = 1_000_000) -> Iterator[LiveWriter]:
    """Publisher transactions on table ``t`` while the block runs (at least a few of them)."""
    writer = LiveWriter(dsn, start)
    writer.thread.start()
    try:
        yield writer
        deadline = time.monotonic() + 10
        while writer.transactions < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        writer.stop()


# --- PostgreSQL as referee, twice: the native subscription that lived through a change, and a fresh one -------
TABLE = "CREATE TABLE t (id int PRIMARY KEY, grp int, v text);"


def referee_publisher(rows: int) -> str:
    """t filtered on its key (so an UPDATE never needs more than the key to be judged); p2 for the cases that
    add or drop a publication."""
    return (TABLE + f"INSERT INTO t SELECT g, g % 10, 'v' || g FROM generate_series(1, {rows}) g;"
            "CREATE PUBLICATION p1 FOR TABLE t WHERE (id % 4 = 0);"
            "CREATE PUBLICATION p2 FOR TABLE t WHERE (id % 5 = 0);")


class Proof:
    """A publisher, our subscription of it (refreshed and copied), and a native one beside it that lives through
    whatever changes; :meth:`fresh` subscribes natively anew, after the change, in a database of its own."""

    def __init__(self, fresh_db, tmp_path: Path, filtering: str, publications: tuple[str, ...] = ("p1",),
                 rows: int = 2000, setup: str | None = None) -> None:
        from airflow_provider_rowfilter.flows.refresh import refresh
        from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
        from airflow_provider_rowfilter.tooling.native import NativeSubscription

        self.publisher, self.ours, lived, self.fresh_dsn = fresh_db(), fresh_db(), fresh_db(), fresh_db()
        execute(self.publisher, referee_publisher(rows) + (setup or ""))
        for dsn in (self.ours, lived, self.fresh_dsn):
            execute(dsn, TABLE)
        self.tmp_path, self.filtering = tmp_path, filtering
        self.path, self.spec = spec_file(tmp_path, self.publisher, self.ours, list(publications), filtering=filtering)
        refresh(self.spec)
        assert sync_tables(self.spec).ok
        self.lived = NativeSubscription(self.publisher, lived, f"lived_{next(names)}", publications).create()
        self.natives = [self.lived]

    def respec(self, publications: tuple[str, ...]) -> None:
        """Our subscription's publications changed (its spec file rewritten, as a user would)."""
        doc = yaml.safe_load(self.path.read_text())
        self.path.write_text(yaml.safe_dump({**doc, "publications": list(publications)}))
        self.spec = SubscriptionSpec.load(self.path)

    def fresh(self, publications: tuple[str, ...]):
        from airflow_provider_rowfilter.tooling.native import NativeSubscription

        native = NativeSubscription(self.publisher, self.fresh_dsn, f"fresh_{next(names)}", publications).create()
        self.natives.append(native)
        return native

    def caught_up(self) -> None:
        """Ours applied up to now, and every native subscription confirmed it."""
        from airflow_provider_rowfilter.flows.apply.drain import apply

        apply(self.spec)
        for native in self.natives:
            native.wait_caught_up()
        apply(self.spec)

    def rows(self, dsn: str) -> dict[str, str]:
        return keyed_rows(dsn, "public.t", "id")

    def drop(self) -> None:
        for native in reversed(self.natives):
            native.drop()
