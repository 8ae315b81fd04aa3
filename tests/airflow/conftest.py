"""Fixtures of the Airflow layer: a private AIRFLOW_HOME, connections as env vars, state tables, dag.test().

Airflow reads its configuration when first imported, so AIRFLOW_HOME is set here, at import of this
conftest, before any test module of this folder imports Airflow.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

_HOME = tempfile.mkdtemp(prefix="rowfilter-airflow-home-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = _HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

from airflow_provider_rowfilter.core.relation import TableName  # noqa: E402
from airflow_provider_rowfilter.core.sync_state import SyncState  # noqa: E402
from airflow_provider_rowfilter.subscriber.state import StateStore, migrate  # noqa: E402
from airflow_provider_rowfilter.tooling.demo.dag_runner import airflow_home  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402
from tests.airflow.cluster import Cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
_conn_counter = itertools.count(1)


def conn_env(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


@pytest.fixture
def airflow_conn(monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Return ``airflow_conn(value, name=None) -> conn_id``: an Airflow connection as an env var.

    ``value`` is a URI or a dict (JSON form). Ids are unique per call, so that no connection
    cached by an earlier test is ever reused.
    """

    def make(value: str | dict[str, Any], name: str = "conn") -> str:
        conn_id = f"rf_{name}_{next(_conn_counter)}"
        monkeypatch.setenv(conn_env(conn_id), value if isinstance(value, str) else json.dumps(value))
        return conn_id

    return make


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
        _add_subscription(self.dsn, subscription)
        return StateDb(self.dsn, self.conn_id, subscription)


def _add_subscription(dsn: str, subscription: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        store = StateStore(conn, subscription)
        with conn.transaction():
            store.ensure_subscription(["p1"], f"rowfilter_{subscription}", f"rowfilter_{subscription}",
                                      {"copy_data": True})
            store.reconcile([TableName("public", "t1"), TableName("public", "t2"), TableName("sales", "t3")],
                            copy_data=True, current_lsn="0/0")


@pytest.fixture
def state_db(fresh_db: Callable[..., str], airflow_conn: Callable[..., str]) -> StateDb:
    """A fresh subscriber with subscription ``s1`` over public.t1, public.t2, sales.t3, all in ``i``."""
    dsn = fresh_db()
    _add_subscription(dsn, "s1")
    return StateDb(dsn, airflow_conn(dsn, "sub"), "s1")


@pytest.fixture(scope="session")
def airflow_db(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An AIRFLOW_HOME with an sqlite metadata database (``airflow db migrate``), as environment."""
    return airflow_home(tmp_path_factory.mktemp("airflow_home"), REPO / "dags")


@pytest.fixture
def cluster(local_pg: LocalPostgres, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Publisher (the demo's tables and publications), subscriber and referee databases, scram roles."""
    made = Cluster(local_pg, f"{abs(hash(request.node.nodeid)) % 100000}")
    made.setup()
    try:
        yield made
    finally:
        made.teardown()


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


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdReceiver]:
    """Airflow's metrics on, through its own StatsD logger, to a socket of the test (as a task process
    sets them up: task_runner.main calls ``stats.initialize`` with the configured factory)."""
    import socket

    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(sock.getsockname()[1]))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    try:
        yield StatsdReceiver(sock)
    finally:
        monkeypatch.undo()
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
        sock.close()
