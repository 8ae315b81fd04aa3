"""Issue 28, items 1, 2 and 6, as found, against the run's local Spark Connect server (spark/connect_server.py).

Found: another OS user (uid 65534) connected to the local server without anything and ran a Python UDF that
printed ``uid=0(root)`` and read the AIRFLOW_CONN_* variables the server had inherited; attached to a job's
session by computing its id from the subscription's name; read ``server.json`` and ``server.log``. Now the
server answers its token only, keeps none of its starter's environment, and its files are its owner's.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_rowfilter.core.spec.spark_remote import SPARK_CONNECT_TOKEN_ENV
from airflow_provider_rowfilter.jobs.exit_status import EXIT_ERROR
from airflow_provider_rowfilter.spark import connect_server
from airflow_provider_rowfilter.spark.session import SESSION_REUSE_SECONDS, remote_conf, reused_session_id
from tests.attacker import as_root_only, run_as_nobody

ATTACK = """
import json, sys
from pyspark.sql import SparkSession

def whoami(_):
    import os, subprocess
    return subprocess.run(["id"], capture_output=True, text=True).stdout + " " + ",".join(sorted(os.environ))

url = sys.argv[1]
for attempt in json.loads(sys.argv[2]):
    try:
        spark = SparkSession.builder.remote(url + attempt).create()
        spark.client.set_retry_policies([])  # a refusal is final: no back-off (it outlasted the timeout under load)
        from pyspark.sql.functions import udf
        print("RAN", spark.range(1).select(udf(whoami, "string")("id")).collect(), flush=True)
    except Exception as e:
        print("REFUSED", type(e).__name__, "UNAUTHENTICATED" in str(e) or "Invalid authentication token" in str(e),
              flush=True)
"""


def _attempts(url: str, session_id: str) -> list[str]:
    """No token (at the address the server binds); a wrong one; a live session's id, claiming a user, without one."""
    return [url.replace("localhost", "127.0.0.1"), f"{url}/;token=wrong-token",
            f"{url}/;session_id={session_id};user_id=root"]


@as_root_only
def test_another_os_user_cannot_run_code_or_attach_to_a_session(spark_connect_server):
    token = Path(spark_connect_server.token_file).read_text().strip()
    live = reused_session_id(token, "s1", "apply", remote_conf({}))
    attempts = _attempts(spark_connect_server.url, str(live))
    done = run_as_nobody(f"import sys; sys.argv[1:] = {['', json.dumps(attempts)]!r}\n" + ATTACK, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RAN" not in done.stdout and done.stdout.count("REFUSED") == 3, done.stdout + done.stderr[-2000:]
    assert done.stdout.count(" True") == 3, done.stdout  # refused by the server, for its token



@as_root_only
def test_another_os_user_reads_none_of_the_server_s_files(spark_connect_server):
    state = Path(spark_connect_server.token_file).parent
    names = [connect_server.STATE_FILE, connect_server.LOG_FILE, connect_server.TOKEN_FILE]
    done = run_as_nobody(f"""
        import os
        print(os.listdir({str(state.parent)!r}))  # it reaches the state directory
        for name in {names!r}:
            try:
                print(name, len(open(os.path.join({str(state)!r}, name)).read()))
            except OSError as e:
                print(name, type(e).__name__)
        try:
            print(os.listdir({str(state)!r}))
        except OSError as e:
            print("listing", type(e).__name__)
    """)
    assert done.stdout.split() == [f"['{state.name}']", *(w for name in names for w in (name, "PermissionError")),
                                   "listing", "PermissionError"], done.stdout + done.stderr
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in state.iterdir()} == dict.fromkeys(names, 0o600)


def test_the_server_keeps_none_of_its_starter_s_environment_and_no_secret_on_its_command_line(spark_connect_server):
    """The server's environment is spark/connect_server.py's own (the run's PGPASSFILE, AIRFLOW_HOME… stay out), its
    token is not on its command line, and what it writes is its user's alone (umask 077)."""
    pid = spark_connect_server.pid
    token = Path(spark_connect_server.token_file).read_text().strip()
    environ = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in e)
    spark_submit_own = {"PWD", "SHLVL", "PYTHONHASHSEED", "_", "OLDPWD"}
    outside = {k for k in environ if k not in connect_server.SERVER_ENVIRONMENT and not k.startswith("SPARK_")
               and k not in spark_submit_own | {"PYSPARK_PYTHON"}}
    assert outside == set(), outside
    assert environ[SPARK_CONNECT_TOKEN_ENV] == token
    assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    umask = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Umask"))
    assert umask.split()[1] == "0077"


@pytest.mark.parametrize("environ", [{"AIRFLOW_CONN_PG": "postgresql://u:pw@h/db", "ROWFILTER_PUBLISHER_PASSWORD": "pw",
                                      "PGPASSWORD": "pw", "AWS_SECRET_ACCESS_KEY": "k", "PATH": "/usr/bin",
                                      "JAVA_HOME": "/opt/java", "SPARK_CONF_DIR": "/etc/spark"}])
def test_server_environment_is_an_allowlist(environ):
    """... and keeps SPARK_CONF_DIR (issue 44, 5b): without it a server started with --master spark://… cannot join
    a cluster that authenticates (its secret in spark-defaults.conf there, never on the command line)."""
    env = connect_server.server_environment("tok", environ)
    assert set(env) == {"PATH", "JAVA_HOME", "SPARK_HOME", "PYSPARK_PYTHON", SPARK_CONNECT_TOKEN_ENV, "SPARK_CONF_DIR"}
    assert env["SPARK_CONF_DIR"] == "/etc/spark"
    assert env[SPARK_CONNECT_TOKEN_ENV] == "tok"


def test_a_job_finds_the_local_server_s_token_in_its_state_directory(spark_connect_server, monkeypatch):
    """``rowfilter apply`` after ``rowfilter spark-server start`` needs nothing more: the token of the server this
    user started at that address; for another address, none."""
    state = Path(spark_connect_server.token_file).parent
    token = Path(spark_connect_server.token_file).read_text().strip()
    port = spark_connect_server.url.rsplit(":", 1)[1]
    assert connect_server.local_token(f"sc://127.0.0.1:{port}", state) == token
    assert connect_server.local_token(f"sc://localhost:{port}/;user_id=etl", state) == token
    assert connect_server.local_token("sc://127.0.0.1:1", state) is None
    assert connect_server.local_token(f"sc://spark.example:{port}", state) is None
    monkeypatch.setenv(SPARK_CONNECT_TOKEN_ENV, "from-the-environment")
    assert connect_server.token_of(f"sc://127.0.0.1:{port}") == "from-the-environment"
    assert SESSION_REUSE_SECONDS > 0 and os.path.exists(spark_connect_server.log)


# --- the review after issue 28, item 5: a server started with --state-dir, and a token refused -------------

JOB = """
import sys
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.jobs.exit_status import run_job
from airflow_provider_rowfilter.spark.session import job_session
def body():
    with job_session(SubscriptionSpec(subscription="s1", publications=("p1",), spark_remote=sys.argv[1]), "apply") as s:
        print("ran", s.range(3).count())
        return 0
sys.exit(run_job(body))
"""


def _job(url: str, **environ: str | None) -> tuple[int, str, float]:
    """A job process attaching to ``url`` with this environment changed (None: removed): exit status, output, seconds."""
    env = {k: v for k, v in {**os.environ, SPARK_CONNECT_TOKEN_ENV: None, **environ}.items() if v is not None}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", JOB, url], capture_output=True, text=True, timeout=180, check=False,
                          env=env)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - began  # stdout first: "ran …" leads


def test_a_job_finds_the_token_of_a_server_started_with_a_state_dir(spark_connect_server, tmp_path):
    """The run's server was started with a state directory of its own (tests/conftest.py), as
    ``rowfilter spark-server start --state-dir D`` does: a job with nothing in its environment finds its token
    (the server named D for its port in the default state directory), and so does one told D."""
    state = Path(spark_connect_server.token_file).parent
    port = int(spark_connect_server.url.rsplit(":", 1)[1])
    assert connect_server._pointer(port).read_text() == str(state.resolve())
    status, out, _ = _job(f"sc://127.0.0.1:{port}")
    assert (status, out.startswith("ran 3")) == (0, True), out[-3000:]
    status, out, _ = _job(f"sc://127.0.0.1:{port}", XDG_STATE_HOME=str(tmp_path),
                          **{connect_server.STATE_DIR_ENV: str(state)})
    assert (status, out.startswith("ran 3")) == (0, True), out[-3000:]


def test_a_token_refused_fails_at_once_without_retry_naming_the_token_file_and_the_fix(spark_connect_server, tmp_path):
    port = int(spark_connect_server.url.rsplit(":", 1)[1])
    status, out, took = _job(f"sc://127.0.0.1:{port}", XDG_STATE_HOME=str(tmp_path))  # where no server says it is
    assert status == EXIT_ERROR and took < 60, out[-3000:]  # not 75: the operators do not retry it
    assert f"ERROR: the Spark Connect server at spark_remote 'sc://127.0.0.1:{port}' asks for a token and this job " \
           "found none (No authentication token provided)" in out, out[-3000:]
    assert f"no token of a server at port {port} is in {tmp_path}/rowfilter/spark-server/token" in out
    assert f"set {connect_server.STATE_DIR_ENV} to the --state-dir it was started with" in out
    assert "Traceback" not in out
    status, out, _ = _job(f"sc://127.0.0.1:{port}", **{SPARK_CONNECT_TOKEN_ENV: "stale-token"})
    assert status == EXIT_ERROR, out[-3000:]
    assert f"refused this job's token, from the environment's {SPARK_CONNECT_TOKEN_ENV}: Invalid authentication " \
           "token" in out and "stale-token" not in out, out[-3000:]
