"""A real Airflow on 127.0.0.1 for tests where scheduling is the point: api-server, scheduler, dag-processor.

Airflow 3's pieces as a deployment runs them (``airflow standalone`` starts the same), with a
LocalExecutor and a sqlite metadata database in a private AIRFLOW_HOME: the dag-processor parses the
DAGs folder, the scheduler creates runs on their schedules, and the tasks report to the api-server's
execution API. Started by the test, stopped (process group by process group) when it ends. The
metadata database is read with sqlite3 directly: no Airflow process is spent on a look.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from airflow_provider_rowfilter.tooling.demo.dag_runner import airflow_home

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningAirflow:
    home: Path
    env: dict[str, str]
    url: str
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def query(self, sql: str, *params: Any) -> list[tuple]:
        with sqlite3.connect(self.home / "airflow.db", timeout=30) as db:
            return db.execute(sql, params).fetchall()

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float) -> T:
        """Poll ``probe`` until it returns something truthy; fail naming ``what`` and the processes' output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise AssertionError(f"airflow {name} exited ({process.returncode}):\n{self.output(name)}")
            found = probe()
            if found:
                return found
            time.sleep(1)
        raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(
            f"--- {name}\n{self.output(name)[-3000:]}" for name in self.processes))

    def output(self, name: str) -> str:
        path = self.home / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def task_logs(self, dag_id: str, task_id: str) -> list[str]:
        return [p.read_text(errors="replace")
                for p in sorted((self.home / "logs" / f"dag_id={dag_id}").glob(f"run_id=*/task_id={task_id}/*.log"))]


def deployment_env(base: dict[str, str], port: int) -> dict[str, str]:
    """Settings that make api-server, scheduler and dag-processor one deployment on 127.0.0.1:``port``."""
    return {
        **base,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "3",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
    }


@contextmanager
def running_airflow(home: Path, dags_folder: Path, env: dict[str, str] | None = None, *,
                    pieces: tuple[str, ...] = ("api-server", "scheduler", "dag-processor"),
                    base: dict[str, str] | None = None) -> Iterator[RunningAirflow]:
    """The ``pieces`` of a deployment (default: api-server, scheduler and dag-processor) of ``home``, a fresh
    AIRFLOW_HOME parsing ``dags_folder`` every few seconds; or of ``base``, the environment of a home made
    already (tests/airflow/conftest.py ``airflow_db``)."""
    port = free_port()
    full = {**deployment_env(base or airflow_home(home, dags_folder), port), **(env or {})}
    home = Path(full["AIRFLOW_HOME"])
    running = RunningAirflow(home, full, f"http://127.0.0.1:{port}")
    try:
        for name in pieces:
            out = (home / f"{name}.out").open("w")
            running.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "airflow", name], env=full, cwd=home, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        if "api-server" in pieces:
            running.wait_for("the api-server", lambda: _answers(f"{running.url}/api/v2/monitor/health"), timeout=180)
        yield running
    finally:
        for process in running.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        stopping = time.monotonic()
        for process in running.processes.values():
            try:
                process.wait(timeout=max(1.0, 30 - (time.monotonic() - stopping)))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False
