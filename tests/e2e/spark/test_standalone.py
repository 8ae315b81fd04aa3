"""Scale-out, proven: the jobs run against a Spark standalone master and two workers, not only ``local[*]``.

A master and two workers (1 core, 1 GiB each) are started on 127.0.0.1 from the pyspark installation
(``bin/spark-class`` with Spark's Master and Worker classes; pip's pyspark ships no
``sbin/start-master.sh``), with ``spark.authenticate`` on and the secret in a 0600 ``spark-defaults.conf`` of
their ``SPARK_CONF_DIR`` (as docs/operations.md says a cluster team sets it: never on a command line). The
package's jobs then run as a user runs them, each in its own process with ``spark_master:
spark://127.0.0.1:<port>`` in the spec and the change log on the run's S3-compatible server (moto): refresh,
snapshot, changes on the publisher, apply. The subscriber must equal PostgreSQL's own subscription to the same
publications; the master and the workers must show that the snapshot's and the apply's Spark work ran there, on
both workers, and that the executors, which have no credentials of their own and no Hadoop connector for S3,
read the batch's segments from the bucket themselves (spark/log_reader.py). A job the cluster cannot give an
executor says so (spark/executor_wait.py).
"""

from __future__ import annotations

import json
import os
import secrets
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
from tests.e2e.jobs.databases import ROW_FILTER_PUBLISHER, ROW_FILTER_TABLES, Databases
from tests.e2e.jobs.snapshot_scenario import SPLIT_SNAPSHOT, T1_SECOND_PAGE

# Not through the session-wide `spark` fixture, but Spark all the same: `-m "not spark"` leaves it out.
pytestmark = pytest.mark.spark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 180  # seconds; two JVMs on a small, busy machine
JOB_TIMEOUT = 300
WORKERS = ("worker-1", "worker-2")


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
    conf_dir: Path

    def secrets(self) -> list[str]:
        """The cluster's secret and the store's secret key (the run's environment's)."""
        own = (self.conf_dir / "spark-defaults.conf").read_text().split()[-1]
        return [own, *([os.environ["AWS_SECRET_ACCESS_KEY"]] if os.environ.get("AWS_SECRET_ACCESS_KEY") else [])]

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
    # The cluster's secret, shared by the master, the workers and every submitting side, in a file of its owner's.
    defaults = conf_dir / "spark-defaults.conf"
    defaults.touch(mode=0o600)
    defaults.write_text(f"spark.authenticate true\nspark.authenticate.secret {secrets.token_hex(32)}\n")
    port, webui_port = _free_port(), _free_port()
    env = {
        # The executors get no store credentials from their environment: the change log's reach them in the task.
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf_dir),  # spark-defaults.conf above; no spark-env.sh of the machine
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
    cluster = Standalone(f"spark://{HOST}:{port}", f"http://{HOST}:{webui_port}", work_dir, log_dir, conf_dir)
    daemons: list[tuple[str, subprocess.Popen]] = []
    try:
        # All at once: the workers retry until the master is up.
        daemons.append(("master", _start("master", [
            "org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(port),
            "--webui-port", str(webui_port)], env, log_dir)))
        for worker in WORKERS:
            daemons.append((worker, _start(worker, [
                "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--webui-port", str(_free_port()),
                "--cores", "1", "--memory", "1g", "--work-dir", str(work_dir), cluster.master_url], env, log_dir)))
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            for name, process in daemons:
                if process.poll() is not None:
                    pytest.fail(f"the Spark {name} exited with {process.returncode}:\n{_tail(log_dir / f'{name}.out')}")
            try:
                state = cluster.state()
            except OSError:
                state = {}
            if state.get("status") == "ALIVE" and state.get("aliveworkers") == len(WORKERS):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"no standalone master with {len(WORKERS)} live workers after {STARTUP_TIMEOUT} s: {state}\n"
                            f"master:\n{_tail(log_dir / 'master.out')}\nworker:\n{_tail(log_dir / 'worker-1.out')}")
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


def job_env(cluster: Standalone, **extra: str) -> dict[str, str]:
    return {
        **os.environ,  # the store's credentials (AWS_*, the s3 fixture's) among them: the driver's
        # What docs/operators.md leaves to the user of a standalone cluster: the executors' Python, the address
        # the driver offers the executors, and the cluster's configuration (its secret).
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": HOST,
        "SPARK_CONF_DIR": str(cluster.conf_dir),
        **extra,
    }


def run_job(job: str, spec: Path, cluster: Standalone, script: str | None = None) -> dict:
    """Run ``python -m airflow_provider_rowfilter.jobs.<job> --spec FILE`` as a user does (or ``python -c script
    FILE``); return its JSON line."""
    command = ["-c", script, str(spec)] if script else ["-m", f"airflow_provider_rowfilter.jobs.{job}", "--spec", str(spec)]
    done = subprocess.run([sys.executable, *command], env=job_env(cluster), cwd=spec.parent, capture_output=True,
                          text=True, timeout=JOB_TIMEOUT)
    assert done.returncode == 0, f"{job} exited with {done.returncode}:\n{done.stdout}\n{done.stderr[-6000:]}"
    for secret in cluster.secrets():  # the cluster's and the store's: never in a job's output
        assert secret not in done.stdout + done.stderr, f"{job} printed a secret"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{job} printed no JSON:\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


def executor_logs(cluster: Standalone, app: dict) -> dict[str, str]:
    """The stderr of each executor of ``app``, by the worker that ran it."""
    found = {}
    for log in sorted((cluster.work_dir / app["id"]).glob("*/stderr")):
        found[log.parent.name] = log.read_text(errors="replace")
    return found


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


WAITING = """
import sys, time
from airflow_provider_rowfilter.spark.session import build_session
session = build_session("rowfilter-waiting", sys.argv[1], {"spark.executor.memory": "4g", "spark.ui.enabled": "false"})
time.sleep(8)
session.stop()
"""


def test_jobs_on_a_standalone_cluster_match_native_replication(standalone, dbs, s3, s3_log, tmp_path):
    dbs.create(ROW_FILTER_PUBLISHER + T1_SECOND_PAGE + ";", ROW_FILTER_TABLES)
    native = dbs.subscribe_native(PUBLICATIONS)
    name = "standalone_s1"
    spec = tmp_path / "subscription.yaml"
    spec.write_text(yaml.safe_dump({
        "subscription": name,
        "publisher": dbs.publisher,
        "subscriber": dbs.ours,
        "publications": list(PUBLICATIONS),
        "change_log": s3_log,  # no shared disk: the bucket
        "spark_master": standalone.master_url,
        "filtering": "spark",  # judged on the cluster (a batch the publisher judged is reduced in the job's process)
        "spark_conf": {"spark.executor.memory": "512m", "spark.ui.enabled": "false",
                       "spark.ui.showConsoleProgress": "false"},
    }))

    # Beside the jobs, an application no worker can take (4 GiB executors on 1 GiB workers) waits; its log says why
    # and what to set (issue 44, 5e). It does not hold up the others: the master gives them the workers' cores.
    waiting = subprocess.Popen([sys.executable, "-c", WAITING, standalone.master_url], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env=job_env(standalone, ROWFILTER_EXECUTOR_WAIT_WARNING="2"))
    refreshed = run_job("refresh", spec, standalone)
    assert sorted(refreshed["tables"]) == sorted(native.tables()) == [f"public.{t}" for t in TABLES]

    copied = run_job("snapshot", spec, standalone, SPLIT_SNAPSHOT)  # two readers each: the copy's tasks on the cluster
    assert copied["ok"] and {t["state"] for t in copied["tables"]} == {"f"}, copied
    assert copied["rows_copied"] == sum(len(table_rows(dbs.ours, t)) for t in TABLES) > 0
    dbs.assert_same(TABLES)

    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        for transaction in CHANGES:
            with conn.transaction():
                for statement in transaction:
                    conn.execute(statement)
    applied = run_job("apply", spec, standalone)
    assert applied["segments"] >= 1 and applied["changes"] > 0, applied
    assert applied["states"] == {f"public.{t}": "r" for t in TABLES}, applied
    native.wait_caught_up()
    dbs.assert_same(TABLES)
    assert all(table_rows(dbs.native, t) for t in TABLES), "a table is empty: the comparison proves little"

    _, waited = waiting.communicate(timeout=JOB_TIMEOUT)
    assert waiting.returncode == 0, waited[-4000:]
    assert "has given this job no executor for" in waited and "spark.cores.max" in waited, waited[-4000:]

    # The Spark work ran on the standalone cluster: the master lists both applications as finished, and the
    # workers ran executors for them that ran tasks, the copy's on both workers.
    state = standalone.state()
    assert state["activeapps"] == []
    apps = {app["name"]: app for app in state["completedapps"]}
    for app_name in (f"rowfilter-snapshot-{name}", f"rowfilter-apply-{name}"):
        assert app_name in apps, f"{app_name} did not run on {standalone.master_url}: {sorted(apps)}"
        assert apps[app_name]["state"] == "FINISHED", apps[app_name]
        logs = executor_logs(standalone, apps[app_name])
        assert logs, f"the workers ran no executor for {app_name} ({apps[app_name]['id']})"
        busy = [e for e, text in logs.items() if "Finished task" in text]
        assert len(busy) == (2 if "snapshot" in app_name else len(busy)) >= 1, (app_name, sorted(logs))
        assert not any(secret in text for secret in standalone.secrets() for text in logs.values())
    # The apply's executors read the batch's segments from the bucket themselves (pyarrow in their Python workers:
    # no hadoop-aws here, and no AWS_* in their environment), every change of it.
    reads = [line for text in executor_logs(standalone, apps[f"rowfilter-apply-{name}"]).values()
             for line in text.splitlines() if line.startswith("rowfilter: read ")]
    assert reads and sum(int(line.split()[2]) for line in reads) >= applied["changes"], reads


