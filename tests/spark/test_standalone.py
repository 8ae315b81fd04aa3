"""Scale-out, proven: the jobs run against a Spark standalone master and worker, not only ``local[*]``.

A master and one worker (2 cores, 1 GiB) are started on 127.0.0.1 from the pyspark installation
(``bin/spark-class`` with Spark's Master and Worker classes; pip's pyspark ships no
``sbin/start-master.sh``). The package's jobs then run as a user runs them, each in its own process
with ``spark_master: spark://127.0.0.1:<port>`` in the spec: refresh, snapshot, changes on the
publisher, apply. The subscriber must equal PostgreSQL's own subscription to the same publications,
and the master and the worker must show that the snapshot's and the apply's Spark work ran there.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyspark
import pytest
import yaml

from airflow_provider_rowfilter.tooling.native import table_rows
from tests.jobs.databases import ROW_FILTER_PUBLISHER, ROW_FILTER_TABLES, Databases
from tests.jobs.snapshot_scenario import SPLIT_SNAPSHOT, T1_SECOND_PAGE

# Not through the session-wide `spark` fixture, but Spark all the same: `-m "not spark"` leaves it out.
pytestmark = pytest.mark.spark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 180  # seconds; two JVMs on a small, busy machine
JOB_TIMEOUT = 300


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} does not exist)"


@dataclass
class Standalone:
    """A running standalone cluster: its master URL, the master's web UI, the worker's directories."""

    master_url: str
    webui_url: str
    work_dir: Path
    log_dir: Path

    def state(self) -> dict:
        """The master's state as its web UI serves it (``/json/``): workers, active and completed apps."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=10) as response:
            return json.load(response)


def _start(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> subprocess.Popen:
    """Start one Spark daemon in the foreground of its own process group (so it and its children stop together)."""
    log = (log_dir / f"{name}.out").open("wb")
    try:
        return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()


def _stop(process: subprocess.Popen) -> None:
    """TERM the daemon's process group (the worker's executors with it), KILL it if it lingers."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # Executors the worker started share its group; make sure none outlives it.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """A Spark standalone master and one worker on 127.0.0.1 (free ports), stopped at the end whatever happens."""
    root = tmp_path_factory.mktemp("spark-standalone")
    work_dir, log_dir, local_dir, conf_dir = (root / d for d in ("work", "logs", "local", "conf"))
    for d in (work_dir, log_dir, local_dir, conf_dir):
        d.mkdir()
    port, webui_port, worker_webui_port = _free_port(), _free_port(), _free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf_dir),  # empty: no spark-defaults.conf or spark-env.sh of the machine
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOG_DIR": str(log_dir),
        "SPARK_WORKER_DIR": str(work_dir),
        "SPARK_LOCAL_DIRS": str(local_dir),
        "SPARK_DAEMON_MEMORY": "256m",
        # The REST submission server would want the fixed port 6066; nothing here submits through it.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        # The executors' Python workers: this interpreter, which has the package and psycopg.
        "PYSPARK_PYTHON": sys.executable,
    }
    cluster = Standalone(f"spark://{HOST}:{port}", f"http://{HOST}:{webui_port}", work_dir, log_dir)
    daemons: list[tuple[str, subprocess.Popen]] = []
    try:
        # Both at once: the worker retries until the master is up.
        daemons.append(("master", _start("master", [
            "org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(port),
            "--webui-port", str(webui_port)], env, log_dir)))
        daemons.append(("worker", _start("worker", [
            "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--webui-port", str(worker_webui_port),
            "--cores", "2", "--memory", "1g", "--work-dir", str(work_dir), cluster.master_url], env, log_dir)))
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            for name, process in daemons:
                if process.poll() is not None:
                    pytest.fail(f"the Spark {name} exited with {process.returncode}:\n{_tail(log_dir / f'{name}.out')}")
            try:
                state = cluster.state()
            except OSError:
                state = {}
            if state.get("status") == "ALIVE" and state.get("aliveworkers") == 1:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"no standalone master with a live worker after {STARTUP_TIMEOUT} s: {state}\n"
                            f"master:\n{_tail(log_dir / 'master.out')}\nworker:\n{_tail(log_dir / 'worker.out')}")
            time.sleep(0.5)
        yield cluster
    finally:
        for _, process in reversed(daemons):
            _stop(process)


@pytest.fixture
def dbs(fresh_db) -> Iterator[Databases]:
    databases = Databases(fresh_db(), fresh_db(), fresh_db())
    yield databases
    for native in databases.natives:
        native.drop()


def run_job(job: str, spec: Path, script: str | None = None) -> dict:
    """Run ``python -m airflow_provider_rowfilter.jobs.<job> --spec FILE`` as a user does (or ``python -c script
    FILE``); return its JSON line."""
    env = {
        **os.environ,
        # What docs/operators.md leaves to the user of a standalone cluster: the executors' Python, and
        # the address the driver offers the executors.
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": HOST,
    }
    command = ["-c", script, str(spec)] if script else ["-m", f"airflow_provider_rowfilter.jobs.{job}", "--spec", str(spec)]
    done = subprocess.run([sys.executable, *command], env=env, cwd=spec.parent, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT)
    assert done.returncode == 0, f"{job} exited with {done.returncode}:\n{done.stdout}\n{done.stderr[-6000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{job} printed no JSON:\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


# p1: t1 WHERE (a > 5 AND c = 'NSW'); p3: t2 WHERE (d = 10), t3 WHERE (g = 10). (p2 would publish t1 unfiltered.)
PUBLICATIONS = ("p1", "p3")
TABLES = ("t1", "t2", "t3")
# One publisher transaction per inner list; every UPDATE transformation (pgoutput_row_filter) occurs.
CHANGES = [
    ["UPDATE t1 SET b = 999 WHERE a = 6"],               # old and new match: UPDATE
    ["UPDATE t1 SET a = 555 WHERE a = 2"],               # only the new row matches: INSERT
    ["UPDATE t1 SET c = 'VIC' WHERE a = 9"],             # only the old row matches: DELETE
    ["UPDATE t1 SET b = 0 WHERE a = 3"],                 # neither: dropped
    ["INSERT INTO t1 VALUES (20, 1, 'NSW'), (21, 2, 'VIC')", "DELETE FROM t1 WHERE a = 10 OR a = 7"],
    ["UPDATE t2 SET f = 33 WHERE d = 10", "UPDATE t2 SET d = 20 WHERE d = 10"],  # UPDATE, then DELETE
    ["UPDATE t2 SET d = 10 WHERE d = 11", "INSERT INTO t2 VALUES (3, 99, 30)", "DELETE FROM t2 WHERE d = 1"],
    ["INSERT INTO t3 SELECT g, g, g FROM generate_series(2, 9) g", "UPDATE t3 SET h = -10 WHERE g = 10",
     "INSERT INTO t3 VALUES (12, 12, 12)"],
]


def test_jobs_on_a_standalone_cluster_match_native_replication(standalone, dbs, tmp_path):
    dbs.create(ROW_FILTER_PUBLISHER + T1_SECOND_PAGE + ";", ROW_FILTER_TABLES)
    native = dbs.subscribe_native(PUBLICATIONS)
    name = "standalone_s1"
    spec = tmp_path / "subscription.yaml"
    spec.write_text(yaml.safe_dump({
        "subscription": name,
        "publisher": dbs.publisher,
        "subscriber": dbs.ours,
        "publications": list(PUBLICATIONS),
        "spark_master": standalone.master_url,
        "filtering": "spark",  # judged on the cluster (a batch the publisher judged is reduced in the job's process)
        "spark_conf": {"spark.executor.memory": "512m", "spark.ui.enabled": "false",
                       "spark.ui.showConsoleProgress": "false"},
    }))

    refreshed = run_job("refresh", spec)
    assert sorted(refreshed["tables"]) == sorted(native.tables()) == [f"public.{t}" for t in TABLES]

    copied = run_job("snapshot", spec, SPLIT_SNAPSHOT)  # two readers each: the copy's tasks run on the cluster
    assert copied["ok"] and {t["state"] for t in copied["tables"]} == {"f"}, copied
    assert copied["rows_copied"] == sum(len(table_rows(dbs.ours, t)) for t in TABLES) > 0
    dbs.assert_same(TABLES)

    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        for transaction in CHANGES:
            with conn.transaction():
                for statement in transaction:
                    conn.execute(statement)
    applied = run_job("apply", spec)
    assert applied["segments"] >= 1 and applied["changes"] > 0, applied
    assert applied["states"] == {f"public.{t}": "r" for t in TABLES}, applied
    native.wait_caught_up()
    dbs.assert_same(TABLES)
    assert all(table_rows(dbs.native, t) for t in TABLES), "a table is empty: the comparison proves little"

    # The Spark work ran on the standalone cluster: the master lists both applications as finished,
    # and the worker ran executors for them that ran tasks.
    state = standalone.state()
    assert state["activeapps"] == []
    apps = {app["name"]: app for app in state["completedapps"]}
    for app_name in (f"rowfilter-snapshot-{name}", f"rowfilter-apply-{name}"):
        assert app_name in apps, f"{app_name} did not run on {standalone.master_url}: {sorted(apps)}"
        app = apps[app_name]
        assert app["state"] == "FINISHED", app
        executor_logs = sorted((standalone.work_dir / app["id"]).glob("*/stderr"))
        assert executor_logs, f"the worker ran no executor for {app_name} ({app['id']})"
        finished = sum(log.read_text(errors="replace").count("Finished task") for log in executor_logs)
        assert finished > 0, f"the executors of {app_name} ran no task"
