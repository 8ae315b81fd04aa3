"""What the Airflow layer's tests share beside their fixtures: the repository, connection variables, state tables, StatsD."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.subscriber.state import StateStore, migrate

REPO = Path(__file__).resolve().parents[2]
TEST_DAGS = Path(__file__).with_name("dags")


def conn_env(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


@dataclass
class StateDb:
    """A subscriber database holding schema ``rowfilter`` and one subscription's rows."""

    dsn: str
    conn_id: str
    subscription: str

    def set_states(self, **states: str) -> None:
        """Walk tables forward (``t1="f"``), through each state in between, as the jobs do."""
        order = [s.value for s in SyncState]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            store = StateStore(conn, self.subscription)
            current = {str(r.table): r.state.value for r in store.tables()}
            for name, target in states.items():
                table = TableName.parse(name)
                for step in order[order.index(current[str(table)]) + 1: order.index(target) + 1]:
                    if step == "s" and target == "r":
                        continue  # f -> r directly, as a catch-up that passes the position at once
                    lsn = None if step in ("i", "d") else "0/16B3748"
                    with conn.transaction():
                        store.set_state(table, SyncState(step), lsn=lsn, rows_copied=3 if step == "f" else None)

    def record_error(self, table: str | None, error: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            StateStore(conn, self.subscription).record_error(TableName.parse(table) if table else None, error)

    def another(self, subscription: str) -> StateDb:
        """The same subscriber with a second subscription over the same tables, all in ``i``."""
        add_subscription(self.dsn, subscription)
        return StateDb(self.dsn, self.conn_id, subscription)


def add_subscription(dsn: str, subscription: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        store = StateStore(conn, subscription)
        with conn.transaction():
            store.ensure_subscription(["p1"], f"rowfilter_{subscription}", f"rowfilter_{subscription}",
                                      {"copy_data": True})
            store.reconcile([TableName("public", "t1"), TableName("public", "t2"), TableName("sales", "t3")],
                            copy_data=True, current_lsn="0/0")


@dataclass
class StatsdReceiver:
    """A UDP socket Airflow's StatsD logger sends to: the metrics as ``name: [value|type, …]``."""

    sock: Any

    def received(self) -> dict[str, list[str]]:
        got: dict[str, list[str]] = {}
        self.sock.settimeout(0.2)
        while True:
            try:
                data = self.sock.recv(65536).decode()
            except TimeoutError:
                return got
            for line in data.splitlines():
                name, _, value = line.partition(":")
                got.setdefault(name, []).append(value)
