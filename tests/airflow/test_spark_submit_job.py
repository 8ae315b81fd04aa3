"""The package's SparkSubmitHook (hooks/spark_submit_job.py): where a job is submitted, the submit, its output."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_rowfilter.hooks.spark_submit_job import JobSubmitHook, spark_master
from airflow_provider_rowfilter.jobs.exit_status import EXIT_STATUS_LINE

CONNECTIONS = {
    "local": {"conn_type": "spark", "host": "local[2]"},
    "standalone-in-host": {"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077},
    "standalone-uri": "spark://10.0.0.5:7077",
    "yarn-cluster": {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}},
}
#: SparkSubmitHook cannot be built for these here (it wants the kubernetes client, which is not installed).
KUBERNETES = {
    "kubernetes": ({"conn_type": "spark", "host": "k8s://https://10.0.0.9:6443", "extra": {"deploy-mode": "cluster"}},
                   "k8s://https://10.0.0.9:6443"),
    "kubernetes-uri": ("k8s://10.0.0.9:6443?deploy-mode=cluster", "k8s://10.0.0.9:6443"),
}


@pytest.mark.parametrize("value", CONNECTIONS.values(), ids=CONNECTIONS.keys())
def test_master_and_deploy_mode_are_spark_submit_hook_s_own(airflow_conn: Callable[..., str], value) -> None:
    """Read with Airflow's public API, the same as SparkSubmitHook's own reading (which this test alone
    looks into: when a provider release reads a connection otherwise, this fails)."""
    conn_id = airflow_conn(value, "spark")
    airflows = SparkSubmitHook(conn_id=conn_id)._connection
    assert spark_master(conn_id) == (airflows["master"], airflows["deploy_mode"])
    hook = JobSubmitHook(conn_id=conn_id)
    assert (hook.master, hook.deploy_mode) == (airflows["master"], airflows["deploy_mode"] or "client")
    assert hook.on_cluster_manager == ("yarn" in airflows["master"] or "k8s" in airflows["master"])


@pytest.mark.parametrize(("value", "master"), KUBERNETES.values(), ids=KUBERNETES.keys())
def test_a_kubernetes_master_is_a_cluster_manager(airflow_conn: Callable[..., str], value, master: str) -> None:
    assert spark_master(airflow_conn(value, "spark")) == (master, "cluster")


def test_the_operator_s_deploy_mode_is_the_one_spark_submit_gets(airflow_conn: Callable[..., str]) -> None:
    conn_id = airflow_conn(CONNECTIONS["yarn-cluster"], "spark")
    hook = JobSubmitHook(conn_id=conn_id, deploy_mode="client")
    assert hook.deploy_mode == "client"
    assert hook._build_spark_submit_command("job.py")[-3:] == ["--deploy-mode", "client", "job.py"]


def test_without_its_connection_spark_submit_hook_s_default_master() -> None:
    assert spark_master("rowfilter_no_such_connection") == ("yarn", None)


@pytest.fixture
def spark_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, int], None]:
    """``spark_submit(printed, status)``: a spark-submit on PATH that prints ``printed`` and exits with ``status``."""
    def make(printed: str, status: int) -> None:
        script = tmp_path / "spark-submit"
        script.write_text(f"#!/bin/sh\ncat <<'OUT'\n{printed}\nOUT\nexit {status}\n")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return make


ERROR = ("INFO airflow_provider_rowfilter.flows.apply.drain: applied s1: 0 batch(es)\n"
         'ERROR: conflict detected on relation "public.t": conflict=insert_exists\n'
         "DETAIL:  Key (id)=(5) already exists in the subscriber.\n")


@pytest.mark.parametrize(("status", "raised"), [(1, AirflowFailException), (75, AirflowException)])
def test_a_failed_job_fails_with_its_own_error_as_its_exit_status_says(airflow_conn, spark_submit, status, raised):
    spark_submit(f"{ERROR}{EXIT_STATUS_LINE}{status}", status)
    hook = JobSubmitHook(conn_id=airflow_conn(CONNECTIONS["local"], "spark"))
    with pytest.raises(AirflowException) as caught:
        hook.submit("job.py")
    assert type(caught.value) is raised
    assert str(caught.value) == ('conflict detected on relation "public.t": conflict=insert_exists\n'
                                 "DETAIL:  Key (id)=(5) already exists in the subscriber.")
    assert hook.output.exit_status == status


def test_a_crash_without_the_job_s_error_keeps_spark_submit_hook_s_exception(airflow_conn, spark_submit) -> None:
    spark_submit("Exception in thread main java.lang.OutOfMemoryError", 1)
    hook = JobSubmitHook(conn_id=airflow_conn(CONNECTIONS["local"], "spark"))
    with pytest.raises(AirflowException, match="Cannot execute") as caught:
        hook.submit("job.py")
    assert not isinstance(caught.value, AirflowFailException)  # retried
    assert hook.output.exit_status is None and hook.output.error_text is None


def test_a_job_s_result_line_is_kept(airflow_conn, spark_submit) -> None:
    spark_submit('INFO airflow_provider_rowfilter.flows.apply.drain: applied s1\n{"subscription": "s1", "batches": 2}', 0)
    hook = JobSubmitHook(conn_id=airflow_conn(CONNECTIONS["local"], "spark"))
    hook.submit("job.py")
    assert hook.output.result == {"subscription": "s1", "batches": 2}
