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
of the shell that starts it reaches the code it runs; and it runs with umask 077, its scratch files
(``spark.local.dir``: shuffle and spill files of replicated rows) in a 0700 directory of its own, so that
what Spark writes is its user's alone. Spark's own ports of its JVM (driver RPC, block manager) ask for
the secret Spark makes in it (spark/settings.py ``network_security``).

A cluster's own Connect server is not started here: point ``spark_remote`` at it (docs/apply.md says how
to require a token there).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
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
from airflow_provider_rowfilter.core.spec.spark_remote import SPARK_CONNECT_TOKEN_ENV, remote_params
from airflow_provider_rowfilter.spark.processes import alive
from airflow_provider_rowfilter.spark.remote import remote_address
from airflow_provider_rowfilter.spark.settings import (
    LOOPBACK,
    STATIC_SQL_SETTINGS,
    UI_ADDRESS_ENV,
    is_local,
    network_security,
    private_local_dir,
    ui_settings,
    wants_local_dir,
    with_jvm_options,
)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002  # Spark Connect's own default (spark.connect.grpc.binding.port)
DEFAULT_MASTER = "local[*]"
logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: The host name of the server's URL: pyspark's client sends a token without TLS only to ``localhost``
#: (gRPC's local channel credentials); to any other name it would insist on TLS.
URL_HOST = "localhost"
STATE_FILE = "server.json"
LOG_FILE = "server.log"
TOKEN_FILE = "token"
#: Where ``rowfilter spark-server`` keeps its files without ``--state-dir``, and where the jobs look for its
#: token first: the same for both when set in the environment of both.
STATE_DIR_ENV = "ROWFILTER_SPARK_SERVER_DIR"
#: In the default state directory: one file per port of a server started with another ``--state-dir``,
#: naming that directory (:func:`local_token` reads it).
SERVERS_DIR = "servers"
#: What the server's process keeps of the environment of whoever starts it: where programs, Java, the locale and
#: the cluster's configuration directories are (``SPARK_CONF_DIR``: a standalone cluster's spark-defaults.conf, with
#: its ``spark.authenticate.secret`` in a 0600 file rather than on the command line; ``HADOOP_CONF_DIR`` and
#: ``YARN_CONF_DIR`` for YARN), nothing else (no AIRFLOW_CONN_*, ROWFILTER_*_PASSWORD, PGPASSWORD, AWS_*, …).
SERVER_ENVIRONMENT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "JAVA_HOME",
                      "SPARK_LOCAL_DIRS", "SPARK_LOCAL_IP", "PYTHONPATH", "VIRTUAL_ENV", "SPARK_CONF_DIR",
                      "HADOOP_CONF_DIR", "YARN_CONF_DIR")


class ServerError(RowFilterError):
    """The local Spark Connect server could not be started or stopped."""


@dataclass(frozen=True)
class ServerInfo:
    """A running local server: its process, its ``sc://`` address and its log."""

    pid: int
    url: str
    log: str
    token_file: str = ""
    local_dir: str = ""  # its spark.local.dir when made here (0700, removed when it is stopped)


def default_state_dir() -> Path:
    """``$ROWFILTER_SPARK_SERVER_DIR``, else ``$XDG_STATE_HOME/rowfilter/spark-server`` (``~/.local/state/…``
    without it): where ``rowfilter spark-server`` keeps its files unless given ``--state-dir``, and where
    the jobs look for its token first."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    return _xdg_state_dir()


def _xdg_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "rowfilter" / "spark-server"


def _pointer(port: int) -> Path:
    """Where a server started with another ``--state-dir`` says which it is, by its port (0600, this user's):
    so that the jobs find its token with nothing more."""
    return _xdg_state_dir() / SERVERS_DIR / str(port)


def server_command(port: int, master: str = DEFAULT_MASTER, conf: Mapping[str, str] | None = None) -> list[str]:
    """The spark-submit command line of the server: loopback only, Spark's RPC and block transfers
    authenticated (spark/settings.py ``network_security``: the secret is Spark's own, made in the server's
    JVM, never on this line), the jobs' JVM options, the caller's ``conf``."""
    settings = {
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        **STATIC_SQL_SETTINGS,
        **network_security(master, conf),
        **(conf or {}),
        **ui_settings(master, conf),  # a UI asked for (--conf spark.ui.enabled=true) cannot kill; on 127.0.0.1
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
    if master.startswith("spark://") and "spark.cores.max" not in (conf or {}):
        logger.warning("the Spark Connect server takes every free core of %s while it runs (spark.cores.max unset): "
                       "jobs submitted to that master beside it wait for cores; start it with --conf "
                       "spark.cores.max=N to leave them room (docs/operations.md, \"On a Spark cluster\")", master)
    private_directory(state)  # 0700 when made here; every file in it is 0600 either way
    log_path, token_path = state / LOG_FILE, state / TOKEN_FILE
    token = secrets.token_urlsafe(32)
    write_private(token_path, token + "\n")
    environment = server_environment(token)
    # Its shuffle and spill files (replicated rows) in a directory of its user's alone: Spark's own variable,
    # which it takes silently (spark.local.dir makes it warn that a cluster manager would override it).
    local_dir = private_local_dir("rowfilter-spark-server-", remove_at_exit=False) \
        if wants_local_dir({"spark.master": master, **(conf or {})}, environment) else ""
    if local_dir:
        environment["SPARK_LOCAL_DIRS"] = local_dir
    if is_local(master):
        environment[UI_ADDRESS_ENV] = LOOPBACK  # where its web UI would listen, if asked for (spark/settings.py)
    with open_private(log_path, "ab") as log:
        process = subprocess.Popen(server_command(port, master, conf), stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True,
                                   umask=0o077)
    info = ServerInfo(process.pid, f"sc://{URL_HOST}:{port}", str(log_path), str(token_path), local_dir)
    deadline = time.monotonic() + timeout
    while not _listening(port):
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                _terminate(process.pid)
            if local_dir:
                shutil.rmtree(local_dir, ignore_errors=True)
            raise ServerError(f"the Spark Connect server did not start (exit status {process.poll()})",
                              detail=_tail(log_path), hint=f"see its log {log_path}")
        time.sleep(0.2)
    write_private(state / STATE_FILE, json.dumps(vars(info)))
    if state.resolve() != _xdg_state_dir().resolve():
        private_directory(_pointer(port).parent)
        write_private(_pointer(port), str(state.resolve()))
    return info


def server_environment(token: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server process's whole environment: :data:`SERVER_ENVIRONMENT` of ``environ`` (this process's), Spark's
    home, this interpreter for the Python workers, and the token (read by the server, never on its command line)."""
    environ = os.environ if environ is None else environ
    return {**{k: environ[k] for k in SERVER_ENVIRONMENT if k in environ},
            "SPARK_HOME": str(_spark_home()), "PYSPARK_PYTHON": sys.executable, SPARK_CONNECT_TOKEN_ENV: token}


def local_token(remote: str, state_dir: Path | None = None) -> str | None:
    """The token of the local server (this user's) when ``remote`` is its address; else None (:func:`find_token`)."""
    return _local_token(remote, state_dir)[0]


def _local_token(remote: str, state_dir: Path | None = None) -> tuple[str | None, list[str]]:
    """The token of this user's local server at ``remote``'s port, and the token files looked at.

    Looked for in ``state_dir`` when given; else in :func:`default_state_dir` (``$ROWFILTER_SPARK_SERVER_DIR``
    or the XDG one), then in the directory a server started with ``--state-dir`` named for its port
    (:func:`_pointer`). So ``rowfilter apply`` after ``rowfilter spark-server start [--state-dir D]`` needs
    nothing more; any other server's token comes from the environment (``SPARK_CONNECT_AUTHENTICATE_TOKEN``)
    or, in Airflow, the Token of the ``spark_connect`` connection.
    """
    host, port = remote_address(remote)
    if host not in ("localhost", "127.0.0.1", "::1"):
        return None, []
    candidates = [Path(state_dir)] if state_dir is not None else [default_state_dir()]
    if state_dir is None:
        try:
            candidates.append(Path(_pointer(port).read_text().strip()))
        except (OSError, ValueError):
            pass
    looked = []
    for directory in candidates:
        looked.append(str(directory / TOKEN_FILE))
        info = status(directory)
        if info is None or remote_address(info.url)[1] != port or not info.token_file:
            continue
        try:
            token = Path(info.token_file).read_text().strip()
        except OSError:
            continue
        if token:
            return token, looked
    return None, looked


def token_of(remote: str) -> str | None:
    """The token a client of ``remote`` sends: the URL's ``token`` parameter, else the environment's, else
    :func:`local_token`."""
    return find_token(remote)[0]


def find_token(remote: str) -> tuple[str | None, str]:
    """:func:`token_of`'s token and where it came from, or where it was looked for (for an error message)."""
    given = next((value for key, value in remote_params(remote)[1] if key == "token"), None)
    if given:
        return given, "the token parameter of spark_remote"
    if os.environ.get(SPARK_CONNECT_TOKEN_ENV):
        return os.environ[SPARK_CONNECT_TOKEN_ENV], f"the environment's {SPARK_CONNECT_TOKEN_ENV}"
    token, looked = _local_token(remote)
    if token:
        return token, f"the token file {looked[-1]}"
    if not looked:
        return None, f"{SPARK_CONNECT_TOKEN_ENV} is not set (and it is not the address of a local server)"
    return None, (f"{SPARK_CONNECT_TOKEN_ENV} is not set, and no token of a server at port {remote_address(remote)[1]} "
                  f"is in {' or '.join(looked)}")


def stop(state_dir: Path | None = None, timeout: float = 60.0) -> ServerInfo | None:
    """Stop the server this state directory started (SIGTERM, then SIGKILL after ``timeout``); None if none ran."""
    state = Path(state_dir or default_state_dir())
    info = status(state)
    if info is None:
        return None
    _terminate(info.pid, timeout)
    (state / STATE_FILE).unlink(missing_ok=True)
    (state / TOKEN_FILE).unlink(missing_ok=True)  # a stopped server's token opens nothing: one less secret on disk
    pointer = _pointer(remote_address(info.url)[1])
    try:
        if pointer.read_text().strip() == str(state.resolve()):
            pointer.unlink()
    except OSError:
        pass
    if info.local_dir:
        shutil.rmtree(info.local_dir, ignore_errors=True)
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
