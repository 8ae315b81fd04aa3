"""A local Spark Connect server for the jobs' ``spark_remote`` (``rowfilter spark-server start|stop|status``).

pyspark 4 carries the server in its own jars (``spark-connect_*.jar``): it is started here as
``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``, detached, listening
on 127.0.0.1 only, with the jobs' JVM options (spark/settings.py) and this interpreter for its
Python workers (they run the jobs' tasks: psycopg, pyarrow). Its process id, address and log file
are kept in a state directory; nothing secret is on its command line (the jobs' passwords reach its
executors inside their tasks: docs/apply.md, "Spark Connect").

A cluster's own Connect server is not started here: point ``spark_remote`` at it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.spark.processes import alive
from airflow_provider_rowfilter.spark.settings import STATIC_SQL_SETTINGS, with_jvm_options

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002  # Spark Connect's own default (spark.connect.grpc.binding.port)
DEFAULT_MASTER = "local[*]"
HOST = "127.0.0.1"
STATE_FILE = "server.json"
LOG_FILE = "server.log"


class ServerError(RowFilterError):
    """The local Spark Connect server could not be started or stopped."""


@dataclass(frozen=True)
class ServerInfo:
    """A running local server: its process, its ``sc://`` address and its log."""

    pid: int
    url: str
    log: str


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/rowfilter/spark-server`` (``~/.local/state/…`` without it)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "rowfilter" / "spark-server"


def server_command(port: int, master: str = DEFAULT_MASTER, conf: Mapping[str, str] | None = None) -> list[str]:
    """The spark-submit command line of the server: loopback only, the jobs' JVM options, the caller's ``conf``."""
    settings = {
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        **STATIC_SQL_SETTINGS,
        **(conf or {}),
    }
    settings = with_jvm_options(settings)  # a long-lived JVM: both JIT compilers (no short-batch option)
    command = [str(_spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", master,
               "--name", "rowfilter-spark-connect"]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    return command


def status(state_dir: Path | None = None) -> ServerInfo | None:
    """The server this state directory started, when it is still running (its state file removed if not)."""
    path = Path(state_dir or default_state_dir()) / STATE_FILE
    try:
        info = ServerInfo(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None
    if not _is_server(info.pid):
        path.unlink(missing_ok=True)
        return None
    return info


def start(state_dir: Path | None = None, *, port: int = DEFAULT_PORT, master: str = DEFAULT_MASTER,
          conf: Mapping[str, str] | None = None, timeout: float = 180.0) -> ServerInfo:
    """Start the server detached and wait until it accepts connections; an already running one is returned.

    :raises ServerError: the port is taken, or the server exited or did not listen within ``timeout``
        (with the end of its log).
    """
    state = Path(state_dir or default_state_dir())
    running = status(state)
    if running is not None:
        return running
    if _listening(port):
        raise ServerError(f"port {port} on {HOST} is already in use by another process",
                          hint="stop it, or start the server on another port (--port) and set spark_remote to match")
    state.mkdir(parents=True, exist_ok=True)
    log_path = state / LOG_FILE
    env = {**os.environ, "SPARK_HOME": str(_spark_home()), "PYSPARK_PYTHON": sys.executable}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(server_command(port, master, conf), stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    info = ServerInfo(process.pid, f"sc://{HOST}:{port}", str(log_path))
    deadline = time.monotonic() + timeout
    while not _listening(port):
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                _terminate(process.pid)
            raise ServerError(f"the Spark Connect server did not start (exit status {process.poll()})",
                              detail=_tail(log_path), hint=f"see its log {log_path}")
        time.sleep(0.2)
    (state / STATE_FILE).write_text(json.dumps(vars(info)))
    return info


def stop(state_dir: Path | None = None, timeout: float = 60.0) -> ServerInfo | None:
    """Stop the server this state directory started (SIGTERM, then SIGKILL after ``timeout``); None if none ran."""
    state = Path(state_dir or default_state_dir())
    info = status(state)
    if info is None:
        return None
    _terminate(info.pid, timeout)
    (state / STATE_FILE).unlink(missing_ok=True)
    return info


def _terminate(pid: int, timeout: float = 60.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _is_server(pid: int) -> bool:
    """``pid`` is alive and is a Spark Connect server (not a process that reused the id)."""
    if not alive(pid):
        return False
    try:
        return SERVER_CLASS.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # no /proc (macOS): trust the live pid
        return True


def _listening(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=1).close()
    except OSError:
        return False
    return True


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent
