"""Spark Connect without a server: what a job and `rowfilter spark-server` say, at once."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from airflow_provider_rowfilter.cli import EXIT_BROKEN, main
from airflow_provider_rowfilter.jobs.exit_status import EXIT_TRANSIENT
from airflow_provider_rowfilter.spark import connect_server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


NO_SERVER = """
import sys, time
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.jobs.exit_status import run_job
from airflow_provider_rowfilter.spark.session import job_session
def body():
    with job_session(SubscriptionSpec(subscription="s1", publications=("p1",), spark_remote=sys.argv[1]), "apply"):
        return 0
sys.exit(run_job(body))
"""


def test_no_server_at_spark_remote_fails_at_once_and_may_be_retried():
    # In a process of its own: pyspark runs one mode per process (this one may hold the classic session).
    url = f"sc://127.0.0.1:{_free_port()}"
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", NO_SERVER, url], capture_output=True, text=True, timeout=120,
                          check=False)
    assert time.monotonic() - began < 30  # pyspark's own retries would take minutes
    assert done.returncode == EXIT_TRANSIENT, done.stderr[-3000:]  # the operator retries
    assert f"ERROR: no Spark Connect server answers at spark_remote '{url}'" in done.stderr
    assert "rowfilter spark-server start" in done.stderr


def test_spark_server_status_and_stop_without_a_server(tmp_path, capsys):
    assert main(["spark-server", "status", "--state-dir", str(tmp_path)]) == EXIT_BROKEN
    assert "no Spark Connect server is running" in capsys.readouterr().out
    assert main(["spark-server", "stop", "--state-dir", str(tmp_path)]) == 0
    assert "no Spark Connect server was running" in capsys.readouterr().out


def test_spark_server_start_refuses_a_port_in_use(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["spark-server", "start", "--state-dir", str(tmp_path), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err
    assert connect_server.status(tmp_path) is None


def test_spark_server_start_refuses_a_conf_without_a_value(tmp_path, capsys):
    assert main(["spark-server", "start", "--state-dir", str(tmp_path), "--conf", "spark.driver.memory"]) == 1
    assert "--conf 'spark.driver.memory' is not KEY=VALUE" in capsys.readouterr().err


def test_the_server_command_line_is_loopback_only_with_the_jobs_jvm_options():
    command = connect_server.server_command(15002, conf={"spark.driver.memory": "2g"})
    settings = dict(command[i + 1].split("=", 1) for i, part in enumerate(command) if part == "--conf")
    assert settings["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert settings["spark.connect.grpc.binding.port"] == "15002"
    assert settings["spark.driver.memory"] == "2g"
    assert settings["spark.sql.codegen.cache.maxEntries"] == "2000"  # static: a client could not set it
    assert "-XX:-DontCompileHugeMethods" in settings["spark.driver.extraJavaOptions"]
    assert "TieredStopAtLevel" not in settings["spark.driver.extraJavaOptions"]  # a long-lived JVM
    assert command[command.index("--class") + 1] == connect_server.SERVER_CLASS
