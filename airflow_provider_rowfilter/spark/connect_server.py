"""A local Spark Connect server for the jobs' ``spark_remote`` (``rowfilter spark-server start|stop|status``).

pyspark 4 carries the server in its own jars (``spark-connect_*.jar``): it is started here as
``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``, detached, listening
on 127.0.0.1 only, with the jobs' JVM options (spark/settings.py) and this interpreter for its
Python workers (they run the jobs' tasks: psycopg, pyarrow). Its process id, address and log file
are kept in a state directory; nothing secret is on its command line (the jobs' passwords reach its
executors inside their tasks: docs/apply.md, "Spark Connect").

Whoever reaches a Connect server runs code as its user, so it answers only clients that hold its token:
a random one made at every start, kept in the 0600 file ``token`` of the 0700 state directory and given
to the server in its environment (``SPARK_CONNECT_AUTHENTICATE_TOKEN``, which Spark reads when
``spark.connect.authenticate.token`` is not set: a setting would show on its command line). The jobs
find it there (:func:`local_token`) or in their own environment. The server's environment is this
module's, not the caller's (:data:`SERVER_ENVIRONMENT`): no Airflow connection, password or cloud key
of the shell that starts it reaches the code it runs; and it runs with umask 077, so that what Spark
writes (shuffle and spill files of replicated rows, the clients' artifacts) is its user's alone.

A cluster's own Connect server is not started here: point ``spark_remote`` at it (docs/apply.md says how
to require a token there).
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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.private_files import open_private, private_directory, write_private
from airflow_provider_rowfilter.core.spec import SPARK_CONNECT_TOKEN_ENV, remote_params
from airflow_provider_rowfilter.spark.processes import alive
from airflow_provider_rowfilter.spark.remote import remote_address
from airflow_provider_rowfilter.spark.settings import STATIC_SQL_SETTINGS, with_jvm_options

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002  # Spark Connect's own default (spark.connect.grpc.binding.port)
DEFAULT_MASTER = "local[*]"
HOST = "127.0.0.1"
#: The host name of the server's URL: pyspark's client sends a token without TLS only to ``localhost``
#: (gRPC's local channel credentials); to any other name it would insist on TLS.
URL_HOST = "localhost"
STATE_FILE = "server.json"
LOG_FILE = "server.log"
TOKEN_FILE = "token"
#: What the server's process keeps of the environment of whoever starts it: where programs, Java and the
#: locale are, nothing else (no AIRFLOW_CONN_*, ROWFILTER_*_PASSWORD, PGPASSWORD, AWS_*, …).
SERVER_ENVIRONMENT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "JAVA_HOME",
                      "SPARK_LOCAL_DIRS", "SPARK_LOCAL_IP", "PYTHONPATH", "VIRTUAL_ENV")


class ServerError(RowFilterError):
    """The local Spark Connect server could not be started or stopped."""


@dataclass(frozen=True)
class ServerInfo:
    """A running local server: its process, its ``sc://`` address and its log."""

    pid: int
    url: str
    log: str
    token_file: str = ""


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
    private_directory(state)  # 0700 when made here; every file in it is 0600 either way
    log_path, token_path = state / LOG_FILE, state / TOKEN_FILE
    token = secrets.token_urlsafe(32)
    write_private(token_path, token + "\n")
    with open_private(log_path, "ab") as log:
        process = subprocess.Popen(server_command(port, master, conf), stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, env=server_environment(token), start_new_session=True,
                                   umask=0o077)
    info = ServerInfo(process.pid, f"sc://{URL_HOST}:{port}", str(log_path), str(token_path))
    deadline = time.monotonic() + timeout
    while not _listening(port):
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                _terminate(process.pid)
            raise ServerError(f"the Spark Connect server did not start (exit status {process.poll()})",
                              detail=_tail(log_path), hint=f"see its log {log_path}")
        time.sleep(0.2)
    write_private(state / STATE_FILE, json.dumps(vars(info)))
    return info


def server_environment(token: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server process's whole environment: :data:`SERVER_ENVIRONMENT` of ``environ`` (this process's), Spark's
    home, this interpreter for the Python workers, and the token (read by the server, never on its command line)."""
    environ = os.environ if environ is None else environ
    return {**{k: environ[k] for k in SERVER_ENVIRONMENT if k in environ},
            "SPARK_HOME": str(_spark_home()), "PYSPARK_PYTHON": sys.executable, SPARK_CONNECT_TOKEN_ENV: token}


def local_token(remote: str, state_dir: Path | None = None) -> str | None:
    """The token of the local server (this user's, in ``state_dir``) when ``remote`` is its address; else None.

    So that ``rowfilter apply`` after ``rowfilter spark-server start`` needs nothing more; any other server's
    token comes from the environment (``SPARK_CONNECT_AUTHENTICATE_TOKEN``) or, in Airflow, the Token of the
    ``spark_connect`` connection.
    """
    host, port = remote_address(remote)
    if host not in ("localhost", "127.0.0.1", "::1"):
        return None
    info = status(state_dir)
    if info is None or remote_address(info.url)[1] != port or not info.token_file:
        return None
    try:
        return Path(info.token_file).read_text().strip() or None
    except OSError:
        return None


def token_of(remote: str) -> str | None:
    """The token a client of ``remote`` sends: the URL's ``token`` parameter, else the environment's, else
    :func:`local_token`."""
    given = next((value for key, value in remote_params(remote)[1] if key == "token"), None)
    return given or os.environ.get(SPARK_CONNECT_TOKEN_ENV) or local_token(remote)


def stop(state_dir: Path | None = None, timeout: float = 60.0) -> ServerInfo | None:
    """Stop the server this state directory started (SIGTERM, then SIGKILL after ``timeout``); None if none ran."""
    state = Path(state_dir or default_state_dir())
    info = status(state)
    if info is None:
        return None
    _terminate(info.pid, timeout)
    (state / STATE_FILE).unlink(missing_ok=True)
    (state / TOKEN_FILE).unlink(missing_ok=True)  # a stopped server's token opens nothing: one less secret on disk
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
