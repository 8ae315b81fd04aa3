"""Fixtures of the Airflow tests, quick (tests/airflow/) and end to end (tests/e2e/airflow/): a private AIRFLOW_HOME,
connections as env vars, state tables, dag.test(), StatsD.

Airflow reads its configuration when first imported, so AIRFLOW_HOME is set here, at import of this module by
either folder's conftest, before any test module there imports Airflow.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

_HOME = tempfile.mkdtemp(prefix="rowfilter-airflow-home-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = _HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

from airflow_provider_rowfilter.tooling.demo.dag_runner import airflow_home  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402
from tests.airflow.cluster import Cluster  # noqa: E402
from tests.airflow.support import REPO, StateDb, StatsdReceiver, add_subscription, conn_env  # noqa: E402

_conn_counter = itertools.count(1)


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


@pytest.fixture
def state_db(fresh_db: Callable[..., str], airflow_conn: Callable[..., str]) -> StateDb:
    """A fresh subscriber with subscription ``s1`` over public.t1, public.t2, sales.t3, all in ``i``."""
    dsn = fresh_db()
    add_subscription(dsn, "s1")
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
