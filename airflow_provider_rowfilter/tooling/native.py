"""PostgreSQL's own logical replication as the referee (tests, demo, bench): a native subscription between two databases.

In one cluster, CREATE SUBSCRIPTION cannot create its slot (it would wait for its own transaction),
so the slot is made first on the publisher and the subscription uses it (PostgreSQL documentation,
CREATE SUBSCRIPTION, "Notes": create the slot separately and use ``create_slot = false``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import psycopg
from psycopg import sql

SYNCED = ("r", "s")


class NativeSubscription:
    """One native subscription ``name`` in database ``subscriber`` to ``publications`` of ``publisher``."""

    def __init__(self, publisher: str, subscriber: str, name: str, publications: Sequence[str],
                 options: dict[str, str] | None = None) -> None:
        self.publisher = publisher
        self.subscriber = subscriber
        self.name = name
        self.publications = tuple(publications)
        self.options = dict(options or {})  # more of CREATE SUBSCRIPTION's WITH options, e.g. {"origin": "none"}

    def create(self, *, timeout: float = 60) -> NativeSubscription:
        with psycopg.connect(self.publisher, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.name,))
        with psycopg.connect(self.subscriber, autocommit=True) as conn:
            conn.execute(sql.SQL(
                "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (create_slot = false, slot_name = {}{})"
            ).format(sql.Identifier(self.name), sql.Literal(self.publisher),
                     sql.SQL(", ").join(map(sql.Identifier, self.publications)), sql.Literal(self.name),
                     sql.SQL("").join(sql.SQL(", {} = {}").format(sql.Identifier(k), sql.Literal(v))
                                      for k, v in self.options.items())))
        self.wait_synced(timeout=timeout)
        return self

    def tables(self) -> dict[str, str]:
        """``pg_subscription_rel``: table name → state."""
        with psycopg.connect(self.subscriber, autocommit=True) as conn:
            return dict(conn.execute(
                """SELECT n.nspname || '.' || c.relname, r.srsubstate FROM pg_subscription_rel r
                   JOIN pg_subscription s ON s.oid = r.srsubid JOIN pg_class c ON c.oid = r.srrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace WHERE s.subname = %s""", (self.name,)).fetchall())

    def wait_synced(self, *, timeout: float = 60) -> dict[str, str]:
        """Wait until every table of the subscription finished its table sync (state r or s)."""
        deadline = time.monotonic() + timeout
        while True:
            tables = self.tables()
            if all(state in SYNCED for state in tables.values()):
                return tables
            if time.monotonic() > deadline:
                raise TimeoutError(f"native subscription {self.name} not synchronised after {timeout} s: {tables}")
            time.sleep(0.05)

    def wait_caught_up(self, *, timeout: float = 60) -> str:
        """Wait until the apply worker confirmed everything the publisher has written so far; return that LSN."""
        with psycopg.connect(self.publisher, autocommit=True) as conn:
            target = conn.execute("SELECT pg_current_wal_lsn()::text").fetchall()[0][0]
            deadline = time.monotonic() + timeout
            while True:
                done = conn.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (target, self.name)).fetchone()
                if done and done[0] and all(s == "r" for s in self.tables().values()):
                    return target
                if time.monotonic() > deadline:
                    raise TimeoutError(f"native subscription {self.name} has not confirmed {target} after {timeout} s")
                time.sleep(0.05)

    def refresh(self, *, timeout: float = 60) -> dict[str, str]:
        """``ALTER SUBSCRIPTION … REFRESH PUBLICATION`` and wait for the new tables' sync."""
        with psycopg.connect(self.subscriber, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER SUBSCRIPTION {} REFRESH PUBLICATION").format(sql.Identifier(self.name)))
        return self.wait_synced(timeout=timeout)

    def drop(self) -> None:
        """Drop the subscription and its slot (DROP SUBSCRIPTION drops the remote slot it names)."""
        with psycopg.connect(self.subscriber, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SUBSCRIPTION IF EXISTS {}").format(sql.Identifier(self.name)))
        with psycopg.connect(self.publisher, autocommit=True) as conn:
            deadline = time.monotonic() + 30
            while conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.name,)).fetchone():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"slot {self.name} still exists after DROP SUBSCRIPTION")
                time.sleep(0.05)


def table_rows(dsn: str, table: str) -> list[str]:
    """Every row of ``table`` in its text form (NULL and '' differ there), sorted: whole-table equality."""
    schema, _, name = table.rpartition(".")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT x::text FROM {}.{} x").format(
            sql.Identifier(schema or "public"), sql.Identifier(name))).fetchall()
    return sorted(r[0] for r in rows)
