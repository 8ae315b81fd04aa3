"""A PostgreSQL primary and its physical standby on 127.0.0.1, for the failover tests (tests/e2e/jobs/test_failover.py):
17 (the first release with failover slots; tests/pg_versions.py) or 18 (the embedded wheel's).

Built once per test module; each failover kills the primary (SIGKILL), promotes the standby and
clones a new standby from it (pg_basebackup), so the pair is ready for the next test. The standby
runs with ``sync_replication_slots``, ``hot_standby_feedback`` and ``primary_slot_name``; the primary
names the standby's physical slot in ``synchronized_standby_slots``: PostgreSQL's setup for failover
slots. Also the workload (random transactions on filtered tables) and the native referee, a
subscription created with ``failover = true`` whose subscriber database lives in the run's shared
cluster.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.pg_versions import bin_dir

STANDBY_SETTINGS = {"sync_replication_slots": "on", "hot_standby_feedback": "on"}

TABLES = ("orders", "items")
SUBSCRIBER_TABLES = """
CREATE TABLE orders(id int PRIMARY KEY, region text, amount int, note text);
CREATE TABLE items(id int PRIMARY KEY, order_id int, qty int);
"""
#: Filters on non-key columns: both tables are REPLICA IDENTITY FULL, so the publisher accepts UPDATE/DELETE.
PUBLISHER_TABLES = SUBSCRIBER_TABLES + """
ALTER TABLE orders REPLICA IDENTITY FULL;
ALTER TABLE items REPLICA IDENTITY FULL;
INSERT INTO orders SELECT g, (ARRAY['eu', 'us', 'asia'])[1 + g % 3], g % 50, 'o' || g FROM generate_series(1, 60) g;
INSERT INTO items SELECT g, 1 + g % 60, g % 7 FROM generate_series(1, 60) g;
CREATE PUBLICATION pa FOR TABLE orders WHERE (region IN ('eu', 'us') AND amount > 10);
CREATE PUBLICATION pb FOR TABLE items WHERE (qty % 3 <> 0);
"""
PUBLICATIONS = ("pa", "pb")
FILTERS = {"orders": "region IN ('eu', 'us') AND amount > 10", "items": "qty % 3 <> 0"}


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def query(dsn: str, statement: str, params: Sequence | None = None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


class HaPair:
    """The current primary and standby; :meth:`kill_primary` and :meth:`promote` make the standby the primary."""

    def __init__(self, version: int = 18) -> None:
        self.version = version
        self.primary = LocalPostgres.start(bin_dir=bin_dir(version))
        assert self.primary.version_num // 10000 == version, self.primary.version_num
        # Every clone carries the superuser's password: one copy of the password file serves both servers,
        # whichever is primary (a path in the URL, never the password). Mode 0600, owned like the cluster's
        # own, so that the native subscriptions (run by the servers' OS user) read it too.
        handle, name = tempfile.mkstemp(prefix="rowfilter-ha-", suffix=".pgpass")
        os.write(handle, self.primary.passfile.read_bytes())
        owner = self.primary.passfile.stat()
        os.fchown(handle, owner.st_uid, owner.st_gid)
        os.close(handle)
        self.passfile = Path(name)
        self.standby: LocalPostgres | None = None
        self.generation = 0
        self.failovers: list[float] = []  # seconds each promotion and new standby took
        self.clone()

    def clone(self) -> None:
        """A new standby of the primary, named in the primary's synchronized_standby_slots."""
        self.generation += 1
        slot = f"standby_{self.generation}"
        self.standby = self.primary.start_standby(slot, STANDBY_SETTINGS)
        # postgresql.auto.conf came with the clone, and what a test set there overrides postgresql.conf.
        execute(self.standby.dsn(), *(f"ALTER SYSTEM SET {k} = '{v}'" for k, v in STANDBY_SETTINGS.items()),
                "SELECT pg_reload_conf()")
        execute(self.primary.dsn(), f"ALTER SYSTEM SET synchronized_standby_slots = '{slot}'",
                "SELECT pg_reload_conf()")

    def url(self, db: str) -> str:
        """One libpq URL for both servers: libpq connects to whichever accepts writes."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/{db}"
                f"?target_session_attrs=read-write&passfile={quote(str(self.passfile), safe='/')}")

    def conninfo(self, db: str) -> str:
        return (f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} dbname={db} user=postgres "
                f"target_session_attrs=read-write passfile={self.passfile}")

    def kill_primary(self) -> None:
        self.primary.crash()

    def promote(self) -> None:
        """Promote the standby (the primary was killed), then clone the next standby from it."""
        began = time.monotonic()
        old, self.primary = self.primary, self.standby
        old.crash()
        self.primary.promote()
        old.stop()
        self.clone()
        self.failovers.append(time.monotonic() - began)

    def fail_over(self) -> None:
        self.kill_primary()
        self.promote()

    def drop_slots(self, db: str) -> None:
        """Drop the slots of a publisher database (it stays: the pair goes at the module's end).

        Not DROP DATABASE: replayed while the standby's slot sync worker holds a synced slot of that
        database, it stops the standby (PostgreSQL 18.6: "FATAL: replication slot … is active for PID …"
        in the startup process).
        """
        admin = self.primary.dsn()
        deadline = time.monotonic() + 60
        while slots := query(admin, "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
                             (db,)):
            for slot, pid in slots:
                if pid is not None:
                    execute(admin, f"SELECT pg_terminate_backend({pid})")
                with contextlib.suppress(psycopg.errors.ObjectInUse):
                    execute(admin, f"SELECT pg_drop_replication_slot('{slot}')")
            assert time.monotonic() < deadline, f"slots of {db} still active: {slots}"
            time.sleep(0.05)

    def stop(self) -> None:
        for server in (self.standby, self.primary):
            if server is not None:
                server.stop()
        self.passfile.unlink(missing_ok=True)


def create_publisher(pair: HaPair, db: str) -> str:
    """A publisher database on the current primary with the scenario's tables and publications; its URL."""
    execute(pair.primary.dsn(), f'DROP DATABASE IF EXISTS "{db}"', f'CREATE DATABASE "{db}"')
    execute(pair.primary.dsn(db), PUBLISHER_TABLES)
    return pair.url(db)


@dataclass
class Workload:
    """Random transactions on the publisher's tables (seeded): inserts, updates that move rows in and out of the
    filters, key changes and deletes."""

    seed: int
    next_key: int = 1000
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def statement(self) -> str:
        r, k = self.rng, self.rng.randrange(1, self.next_key)
        kind = r.randrange(8)
        if kind in (0, 1):
            self.next_key += 1
            return (f"INSERT INTO orders VALUES ({self.next_key}, '{r.choice(['eu', 'us', 'asia'])}', "
                    f"{r.randrange(30)}, 'n{self.next_key}')")
        if kind == 2:
            return f"UPDATE orders SET amount = {r.randrange(30)}, note = note || '+' WHERE id = {k}"
        if kind == 3:
            return f"UPDATE orders SET region = '{r.choice(['eu', 'us', 'asia'])}' WHERE id = {k}"
        if kind == 4:
            return f"DELETE FROM orders WHERE id = {k}"
        if kind == 5:
            self.next_key += 1
            return f"INSERT INTO items VALUES ({self.next_key}, {k}, {r.randrange(10)})"
        if kind == 6:
            return f"UPDATE items SET qty = qty + {r.randrange(1, 4)} WHERE id = {k}"
        return f"UPDATE items SET id = id + 100000 WHERE id = {k}"  # a key change

    def run(self, dsn: str, transactions: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(transactions):
                with conn.transaction():
                    for _ in range(self.rng.randrange(1, 4)):
                        conn.execute(self.statement())


def filtered_rows(dsn: str, table: str) -> list[str]:
    """The publisher's rows of ``table`` its filter keeps: what every subscriber must hold."""
    return sorted(r[0] for r in query(dsn, f"SELECT x::text FROM {table} x WHERE {FILTERS[table]}"))


class Native:
    """The referee: ``CREATE SUBSCRIPTION … WITH (failover = true)`` from a database of the shared cluster."""

    def __init__(self, subscriber: str, name: str, conninfo: str, publisher: Callable[[], str]) -> None:
        self.subscriber, self.name, self.publisher = subscriber, name, publisher
        execute(subscriber, SUBSCRIBER_TABLES, sql.SQL(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION pa, pb WITH (failover = true)").format(
            sql.Identifier(name), sql.Literal(conninfo)).as_string(None))

    def reconnect(self, conninfo: str) -> None:
        execute(self.subscriber, sql.SQL("ALTER SUBSCRIPTION {} CONNECTION {}").format(
            sql.Identifier(self.name), sql.Literal(conninfo)).as_string(None))

    def wait_caught_up(self, timeout: float = 90) -> None:
        """Every table ``r`` and the slot confirmed through the publisher's WAL position now."""
        target = query(self.publisher(), "SELECT pg_current_wal_lsn()::text")[0][0]
        deadline = time.monotonic() + timeout
        while True:
            states = {s for (s,) in query(self.subscriber, "SELECT srsubstate FROM pg_subscription_rel")}
            done = query(self.publisher(), "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                         "WHERE slot_name = %s", (target, self.name))
            if states == {"r"} and done and done[0][0]:
                return
            assert time.monotonic() < deadline, f"native subscription {self.name} not caught up: {states}, {done}"
            time.sleep(0.1)

    def drop(self) -> None:
        execute(self.subscriber, f"ALTER SUBSCRIPTION {self.name} DISABLE",
                f"ALTER SUBSCRIPTION {self.name} SET (slot_name = NONE)", f"DROP SUBSCRIPTION {self.name}")

    def rows(self, table: str) -> list[str]:
        return table_rows(self.subscriber, table)
