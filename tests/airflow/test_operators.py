"""The operators: the rendered spec, the spark-submit command they submit, and where passwords go.

The refresh operator is executed for real: spark-submit (pyspark's) runs the packaged job against
fresh publisher and subscriber databases. Bad specs fail with AirflowFailException before anything
is submitted.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException

import airflow_provider_rowfilter
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator
from airflow_provider_rowfilter.operators.rowfilter_job import RowFilterJobOperator
from airflow_provider_rowfilter.operators.snapshot_copy import SnapshotCopyOperator
from tests.airflow.operator_databases import (
    PUB_PASSWORD,
    SUB_PASSWORD,
    Databases,
    operator_databases,
    postgres_conn,
)
from tests.roles import PUBLISHER, SUBSCRIBER, PasswordRole

PACKAGE_DIR = Path(airflow_provider_rowfilter.__file__).resolve().parent


@pytest.fixture
def dbs(fresh_db: Callable[..., str], airflow_conn: Callable[..., str], password_roles: Any) -> Databases:
    """A publisher with t1, t2 and publications p1 (filtered), p2; an empty subscriber; connections
    (tests/airflow/operator_databases.py), as the run's password roles."""
    return operator_databases(fresh_db, airflow_conn)


def _url(dsn: str, role: PasswordRole | None = None) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return (f"postgresql://{role.name if role else info['user']}@{info['host']}:{info['port']}/{info['dbname']}"
            "?connect_timeout=10&sslmode=disable")


def _render(op: RowFilterJobOperator, params: dict[str, Any]) -> dict[str, Any]:
    context: dict[str, Any] = {"params": params}
    op.render_template_fields(context)
    return context


def _command(op: RowFilterJobOperator) -> list[str]:
    """The spark-submit command line, built by SparkSubmitHook itself."""
    hook = op._hook or op._get_hook()
    return hook._build_spark_submit_command(op.application)


def _spec_from(command: list[str]) -> SubscriptionSpec:
    return SubscriptionSpec.from_json(command[command.index("--spec-json") + 1])


def test_template_fields_extend_spark_submit() -> None:
    parent = list(SparkSubmitOperator.template_fields)
    for op in (RefreshPublicationOperator, SnapshotCopyOperator):
        assert list(op.template_fields[: len(parent)]) == parent
        assert {"spec", "subscription", "publications", "publisher_conn_id", "subscriber_conn_id",
                "publications_ddl"} <= set(op.template_fields)
    assert "tables" in SnapshotCopyOperator.template_fields


def test_constructor_stores_arguments_and_does_nothing_else() -> None:
    # No connection exists: __init__ must not look any up (it runs on every DAG parse).
    op = SnapshotCopyOperator(task_id="s", subscription="{{ params.s }}", publications=["p1"],
                              publisher_conn_id="nowhere_pub", subscriber_conn_id="nowhere_sub", tables="t1")
    assert (op.subscription, op.publications, op.tables) == ("{{ params.s }}", ["p1"], "t1")
    assert op.application == str(PACKAGE_DIR / "jobs" / "snapshot.py")
    assert op.application_args is None and op.env_vars is None
    with pytest.raises(TypeError, match="sets application_args itself"):
        RefreshPublicationOperator(task_id="r", application_args=["--spec", "x"])


def test_jdbc_jar_is_deprecated_and_ships_nothing(dbs: Databases) -> None:
    # No job uses JDBC any more: the old keyword still constructs (a DAG written for the old release
    # keeps parsing), warns as Airflow providers deprecate, and adds no jar to the command line.
    with pytest.warns(AirflowProviderDeprecationWarning, match=r"jdbc_jar=\.\.\.\) is deprecated and ignored"):
        op = SnapshotCopyOperator(task_id="s", subscription="s1", publications=["p1"], jdbc_jar="/opt/pg.jar",
                                  publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                  conn_id=dbs.spark_conn)
    assert "jdbc_jar" not in op.template_fields
    op.prepare_submit()
    command = _command(op)
    assert "/opt/pg.jar" not in " ".join(command)
    assert "--jars" not in command and "--driver-class-path" not in command


def test_refresh_operator_submits_the_packaged_job(dbs: Databases, caplog: pytest.LogCaptureFixture,
                                                   capfd: pytest.CaptureFixture[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("ROWFILTER_CLASS_ARCHIVE_DIR", str(tmp_path / "archives"))  # the refresh job makes none
    with DAG("rowfilter_operator_test", schedule=None):
        op = RefreshPublicationOperator(
            task_id="refresh", subscription="{{ params.subscription }}", publications="{{ params.publications }}",
            publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn, conn_id=dbs.spark_conn,
            conf={"spark.ui.enabled": "false"})
    context = _render(op, {"subscription": "s_op", "publications": "p1, p2"})
    assert (op.subscription, op.publications) == ("s_op", "p1, p2")

    result = op.execute(context)

    # What the task returns (XCom): read back from the subscriber after the job.
    assert result["subscription"] == "s_op"
    assert (result["added"], result["removed"]) == (["public.t1", "public.t2"], [])
    assert result["lsn"]
    assert result["tables"] == [{"table": "public.t1", "state": "i", "lsn": None},
                                {"table": "public.t2", "state": "i", "lsn": None}]
    # The command SparkSubmitHook ran: the job file inside the installed package, the spec as JSON.
    command = _command(op)
    assert command[0] == "spark-submit"
    assert command[command.index("--master") + 1] == "local[2]"
    assert command[command.index("--name") + 1] == "rowfilter-refresh"
    application = str(PACKAGE_DIR / "jobs" / "refresh.py")
    assert Path(application).is_file()
    assert command[command.index(application) + 1:] == ["--spec-json", command[-1]]
    assert _spec_from(command) == SubscriptionSpec(
        subscription="s_op", publications=("p1", "p2"), publisher=_url(dbs.pub, PUBLISHER),
        subscriber=_url(dbs.sub, SUBSCRIBER),
        publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn, spark_master="local[2]")
    # Passwords: in env_vars only; never on the command line, never in a log line.
    assert op.env_vars["ROWFILTER_PUBLISHER_PASSWORD"] == PUB_PASSWORD
    assert op.env_vars["ROWFILTER_SUBSCRIBER_PASSWORD"] == SUB_PASSWORD
    out, err = capfd.readouterr()
    logs = "\n".join(r.getMessage() for r in caplog.records) + out + err
    assert "Spark-Submit cmd" in logs and '"added": ["public.t1", "public.t2"]' in logs  # the job's own output
    for secret in (PUB_PASSWORD, SUB_PASSWORD):
        assert secret not in " ".join(command)
        assert secret not in logs
    assert "***" not in logs  # nothing even tried to print a secret (the masker would show ***)

    assert not (tmp_path / "archives").exists()

    # Idempotent: a second refresh adds and removes nothing.
    again = RefreshPublicationOperator(task_id="refresh2", subscription="s_op", publications=["p1", "p2"],
                                       publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                       conn_id=dbs.spark_conn, conf={"spark.ui.enabled": "false"})
    second = again.execute({})
    assert (second["added"], second["removed"], second["lsn"]) == ([], [], None)
    assert second["tables"] == result["tables"]


def test_a_configuration_error_fails_the_task_at_once_with_postgresql_s_message(
        dbs: Databases, capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 18 item 3: a missing publication is no reason to retry; the task's exception is the cause."""
    op = RefreshPublicationOperator(task_id="refresh", subscription="s1", publications=["p_missing"],
                                    publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                    conn_id=dbs.spark_conn, conf={"spark.ui.enabled": "false"})
    with pytest.raises(AirflowFailException) as e:  # no retry
        op.execute({})
    assert str(e.value).startswith("""publication 'p_missing': publication "p_missing" does not exist\nHINT:  """), \
        str(e.value)
    assert "spark-submit" not in str(e.value) and "Traceback" not in str(e.value)
    out, err = capfd.readouterr()
    for secret in (PUB_PASSWORD, SUB_PASSWORD):
        assert secret not in str(e.value) and secret not in out + err


def test_a_refused_connection_is_retried(dbs: Databases, airflow_conn: Callable[..., str]) -> None:
    """Issue 18 item 3: a publisher that refuses connections may be back for the next try (exit 75)."""

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = airflow_conn({**postgres_conn(dbs.pub, None), "host": "127.0.0.1", "port": port}, "refused")
    op = RefreshPublicationOperator(task_id="refresh", subscription="s1", publications=["p1"],
                                    publisher_conn_id=refused, subscriber_conn_id=dbs.sub_conn,
                                    conn_id=dbs.spark_conn, conf={"spark.ui.enabled": "false"})
    with pytest.raises(AirflowException) as e:
        op.execute({})
    assert not isinstance(e.value, AirflowFailException)  # Airflow's retries apply
    assert str(e.value).startswith("cannot connect to the publisher of subscription 's1' at host 127.0.0.1")
    assert "Connection refused" in str(e.value) or "connection refused" in str(e.value).lower()


def test_an_apply_task_that_cannot_reach_a_database_submits_the_job(
        dbs: Databases, airflow_conn: Callable[..., str], capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """skip_when_idle: the task's own attempt is no stricter than the job (a worker may not reach a database
    where the cluster does); the job then decides, here with the same error, and Airflow's retries apply."""
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = airflow_conn({**postgres_conn(dbs.pub, None), "host": "127.0.0.1", "port": port}, "refused_apply")
    op = ApplyChangesOperator(task_id="apply", subscription="s1", publications=["p1"], publisher_conn_id=dbs.pub_conn,
                              subscriber_conn_id=refused, conn_id=dbs.spark_conn, change_log=str(tmp_path),
                              conf={"spark.ui.enabled": "false"})
    with pytest.raises(AirflowException) as e:
        op.execute({})
    assert not isinstance(e.value, AirflowFailException)
    out, err = capfd.readouterr()
    warned = [line for line in (out + err).splitlines() if "The task could not go on applying itself" in line]
    assert len(warned) == 1 and "[warning" in warned[0] and "skip_when_idle=False" in warned[0], warned
    assert (f"(cannot connect to the subscriber of subscription 's1' at host 127.0.0.1 (Airflow connection "
            f"'{refused}'))") in warned[0]  # the connection named too (issue 29 item 6)
    assert op._output is not None  # spark-submit ran: the job failed as it would have without the task's attempt


def test_snapshot_command_from_a_templated_spec_file(dbs: Databases, tmp_path: Path) -> None:
    (tmp_path / "publications.sql").write_text("CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 2);\n")
    (tmp_path / "s1.yaml").write_text(
        f"subscription: s1\npublisher_conn_id: {dbs.pub_conn}\nsubscriber: {_url(dbs.sub)}\n"
        "publications: [p1]\npublications_ddl: publications.sql\ncopy_data: true\n")
    op = SnapshotCopyOperator(task_id="snapshot", spec="{{ params.dir }}/s1.yaml", tables="{{ params.tables }}",
                              subscriber_conn_id=dbs.sub_conn, conn_id=dbs.spark_conn,
                              env_vars={"TZ": "UTC"})
    _render(op, {"dir": str(tmp_path), "tables": "t2, public.t1"})
    op.prepare_submit()
    command = _command(op)
    application = str(PACKAGE_DIR / "jobs" / "snapshot.py")
    assert command[command.index(application) + 1:] == [
        "--spec-json", command[command.index("--spec-json") + 1], "--table", "public.t1", "--table", "public.t2"]
    # The file's keys, the operator's subscriber_conn_id in place of the file's subscriber URL, and
    # publications_ddl resolved next to the spec file.
    spec = _spec_from(command)
    assert replace(spec, change_log=None) == SubscriptionSpec(
        subscription="s1", publications=("p1",), publisher=_url(dbs.pub, PUBLISHER),
        subscriber=_url(dbs.sub, SUBSCRIBER), publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
        publications_ddl=str(tmp_path / "publications.sql"), spark_master="local[2]")
    # The file's other keys come through as SubscriptionSpec.load resolved them.
    assert spec.change_log == SubscriptionSpec.load(tmp_path / "s1.yaml").change_log
    # No job reads over JDBC: no driver jar is shipped or put on the driver's class path.
    assert "--jars" not in command and "--driver-class-path" not in command
    assert op.env_vars["TZ"] == "UTC"  # the user's env_vars are kept
    assert {k: op.env_vars[k] for k in op.env_vars if k.startswith("ROWFILTER")} == {
        "ROWFILTER_PUBLISHER_PASSWORD": PUB_PASSWORD, "ROWFILTER_SUBSCRIBER_PASSWORD": SUB_PASSWORD}
    assert PUB_PASSWORD not in " ".join(command) and SUB_PASSWORD not in " ".join(command)


def test_snapshot_resync_and_tuning_arguments(dbs: Databases) -> None:
    op = SnapshotCopyOperator(task_id="backfill", subscription="s1", publications=["p1"], tables=["t1"],
                              resync=True, max_partitions=4, fetch_size=5000, publisher_conn_id=dbs.pub_conn,
                              subscriber_conn_id=dbs.sub_conn, conn_id=dbs.spark_conn)
    op.prepare_submit()
    assert op.application_args[2:] == ["--table", "public.t1", "--resync", "--max-partitions", "4",
                                       "--fetch-size", "5000"]
    # The same arguments the job's own parser accepts.
    from airflow_provider_rowfilter.jobs.snapshot import snapshot_parser

    args = snapshot_parser().parse_args(op.application_args)
    assert (args.table, args.resync, args.max_partitions, args.fetch_size) == (["public.t1"], True, 4, 5000)


def test_no_password_no_environment_variable(dbs: Databases, airflow_conn: Callable[..., str]) -> None:
    pub = airflow_conn(postgres_conn(dbs.pub, None), "pub_nopw")
    sub = airflow_conn(postgres_conn(dbs.sub, None), "sub_nopw")
    op = RefreshPublicationOperator(task_id="r", subscription="s1", publications=["p1"], publisher_conn_id=pub,
                                    subscriber_conn_id=sub, conn_id=dbs.spark_conn)
    op.prepare_submit()
    assert not {k for k in op.env_vars if k.startswith("ROWFILTER")}


def test_cluster_manager_would_put_passwords_on_the_command_line(dbs: Databases,
                                                                airflow_conn: Callable[..., str]) -> None:
    yarn = airflow_conn({"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}, "yarn")
    kwargs = {"task_id": "r", "subscription": "s1", "publications": ["p1"], "publisher_conn_id": dbs.pub_conn,
              "subscriber_conn_id": dbs.sub_conn, "conn_id": yarn}
    with pytest.raises(AirflowFailException, match="forward_passwords=False") as e:
        RefreshPublicationOperator(**kwargs).prepare_submit()
    assert PUB_PASSWORD not in str(e.value) and SUB_PASSWORD not in str(e.value)
    op = RefreshPublicationOperator(forward_passwords=False, **kwargs)
    op.prepare_submit()
    command = " ".join(_command(op))
    assert "--master yarn" in command and "--deploy-mode cluster" in command
    assert "--driver-class-path" not in command  # a path on this machine means nothing to a remote driver
    assert PUB_PASSWORD not in command and SUB_PASSWORD not in command
    assert not op.env_vars  # nothing forwarded, not even the local interpreter: the driver runs remotely


def _bad(dbs: Databases, tmp_path: Path, airflow_conn: Callable[..., str], case: str) -> dict[str, Any]:
    base = {"subscription": "s1", "publications": ["p1"], "publisher_conn_id": dbs.pub_conn,
            "subscriber_conn_id": dbs.sub_conn}
    if case == "spec-file-unknown-key":
        (tmp_path / "bad.yaml").write_text("subscription: s1\npublications: [p1]\nslot: x\n")
        return {"spec": str(tmp_path / "bad.yaml"), "publisher_conn_id": dbs.pub_conn,
                "subscriber_conn_id": dbs.sub_conn}
    if case == "spec-file-password":
        (tmp_path / "pw.yaml").write_text(f"subscription: s1\npublications: [p1]\n"
                                          f"publisher: postgresql://u:hunter22@h/db\nsubscriber_conn_id: {dbs.sub_conn}\n")
        return {"spec": str(tmp_path / "pw.yaml")}
    if case == "spec-file-both":
        (tmp_path / "both.yaml").write_text(f"subscription: s1\npublications: [p1]\npublisher: {_url(dbs.pub)}\n"
                                            f"publisher_conn_id: {dbs.pub_conn}\nsubscriber_conn_id: {dbs.sub_conn}\n")
        return {"spec": str(tmp_path / "both.yaml")}
    changes: dict[str, Any] = {
        "no-publications": {"publications": []},
        "publications-not-names": {"publications": [1, 2]},
        "bad-name": {"subscription": "Bad-Name"},
        "missing-connection": {"publisher_conn_id": "rf_nowhere"},
        "wrong-connection-type": {"subscriber_conn_id": dbs.spark_conn},
        "no-subscriber": {"subscriber_conn_id": None},
        "missing-spec-file": {"spec": str(tmp_path / "absent.yaml")},
        "bad-table": {"tables": ["a.b.c"]},
        "resync-without-tables": {"resync": True},
        "bad-max-partitions": {"max_partitions": 0},
        "spark-conf-not-mapping": {"spark_conf": "spark.x=1"},
    }
    return {**base, **changes[case]}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param("no-publications", "subscription 's1' names no publications", id="no-publications"),
        pytest.param("publications-not-names", "publications=[1, 2] is not a list of names", id="publications-not-names"),
        pytest.param("bad-name", "subscription name 'Bad-Name' is not a valid PostgreSQL name", id="bad-name"),
        pytest.param("missing-connection", "publisher_conn_id='rf_nowhere': no such Airflow connection", id="missing-connection"),
        pytest.param("wrong-connection-type", "subscriber_conn_id='{spark}' is a connection of type 'spark'",
                     id="wrong-connection-type"),
        pytest.param("no-subscriber", "has no subscriber\nHINT:  pass subscriber_conn_id=", id="no-subscriber"),
        pytest.param("missing-spec-file", "spec file '{tmp}/absent.yaml' does not exist", id="missing-spec-file"),
        pytest.param("spec-file-unknown-key", "unknown key 'slot'", id="spec-file-unknown-key"),
        pytest.param("spec-file-password", "the publisher of subscription 's1' carries a password", id="spec-file-password"),
        pytest.param("spec-file-both", "sets both publisher (", id="spec-file-both"),
        pytest.param("bad-table", "tables: 'a.b.c' is not a table name", id="bad-table"),
        pytest.param("resync-without-tables", "resync=True needs the tables to copy again", id="resync-without-tables"),
        pytest.param("bad-max-partitions", "max_partitions=0 is not a positive integer", id="bad-max-partitions"),
        pytest.param("spark-conf-not-mapping", "spark_conf='spark.x=1' is not a mapping of Spark settings",
                     id="spark-conf-not-mapping"),
    ],
)
def test_bad_spec_fails_without_retry_naming_the_setting(dbs: Databases, tmp_path: Path,
                                                         airflow_conn: Callable[..., str], case: str,
                                                         expected: str) -> None:
    kwargs = _bad(dbs, tmp_path, airflow_conn, case)
    op = SnapshotCopyOperator(task_id="snapshot", conn_id=dbs.spark_conn, retries=3, **kwargs)
    with pytest.raises(AirflowFailException) as e:
        op.execute({})
    assert expected.format(spark=dbs.spark_conn, tmp=tmp_path) in str(e.value)
    assert str(e.value).startswith("snapshot: ")
    assert op.application_args is None  # nothing was submitted
    assert "hunter22" not in str(e.value)


def test_spark_side_python_is_this_interpreter_in_local_mode(dbs: Databases, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    # A Spark session built earlier in this process (spark/session.py) sets PYSPARK_PYTHON, which
    # counts as the user's choice: start from an environment that made none.
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        monkeypatch.delenv(name, raising=False)

    op = RefreshPublicationOperator(task_id="r", subscription="s1", publications=["p1"],
                                    publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                    conn_id=dbs.spark_conn)
    op.prepare_submit()
    assert op.env_vars["PYSPARK_PYTHON"] == op.env_vars["PYSPARK_DRIVER_PYTHON"] == sys.executable
    # where the driver's web UI would listen, if spark_conf asked for one (tests/spark/test_spark_ui.py)
    assert op.env_vars["SPARK_LOCAL_IP"] == "127.0.0.1"
    chosen = RefreshPublicationOperator(task_id="r", subscription="s1", publications=["p1"],
                                        publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                        conn_id=dbs.spark_conn, conf={"spark.pyspark.python": "/opt/py/bin/python"})
    chosen.prepare_submit()
    assert "PYSPARK_PYTHON" not in chosen.env_vars


def test_jvm_options_reach_spark_submit(dbs: Databases) -> None:
    """The driver's JVM is started by spark-submit: the jobs' JVM options must be on its --conf (the class
    archive's, off here as in every test that does not ask for it, are the apply test's)."""
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator


    op = ApplyChangesOperator(task_id="a", subscription="s1", publications=["p1"],
                              publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                              conn_id=dbs.spark_conn, conf={"spark.driver.extraJavaOptions": "-Xss4m"})
    op.prepare_submit()
    command = _command(op)
    confs = [command[i + 1] for i, arg in enumerate(command) if arg == "--conf"]
    # Each apply submission is a JVM that lives for one batch: the quick compiler only (spark/settings.py).
    assert ("spark.driver.extraJavaOptions=-Xss4m -Duser.timezone=UTC -XX:-DontCompileHugeMethods "
            "-XX:PerMethodTrapLimit=0 -XX:TieredStopAtLevel=1") in confs
    assert ("spark.executor.extraJavaOptions=-Duser.timezone=UTC -XX:-DontCompileHugeMethods "
            "-XX:PerMethodTrapLimit=0 -XX:TieredStopAtLevel=1") in confs
    # A long batch, and the other jobs, keep HotSpot's optimising compiler.
    long = ApplyChangesOperator(task_id="a", subscription="s1", publications=["p1"], max_changes="300001",
                                publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                conn_id=dbs.spark_conn)
    refresh = RefreshPublicationOperator(task_id="r", subscription="s1", publications=["p1"],
                                         publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                         conn_id=dbs.spark_conn)
    for other in (long, refresh):
        other.prepare_submit()
        assert other.conf["spark.driver.extraJavaOptions"] == (
            "-Duser.timezone=UTC -XX:-DontCompileHugeMethods -XX:PerMethodTrapLimit=0")


@pytest.mark.parametrize(("budget", "seconds"), [
    pytest.param(None, None, id="none: the run drains"),
    pytest.param(0, 0.0, id="zero: one batch"),
    pytest.param("90", 90.0, id="string"),
    pytest.param(timedelta(minutes=4), 240.0, id="timedelta"),
    pytest.param("{{ params.budget }}", 150.5, id="template"),
])
def test_apply_time_budget_reaches_the_job(dbs: Databases, budget: Any, seconds: float | None) -> None:
    """time_budget (seconds, a timedelta or a template) becomes the job's --time-budget, as the job parses it."""
    from airflow_provider_rowfilter.jobs.apply import apply_parser
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    op = ApplyChangesOperator(task_id="a", subscription="s1", publications=["p1"], time_budget=budget,
                              publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                              conn_id=dbs.spark_conn)
    assert "time_budget" in op.template_fields
    _render(op, {"budget": "150.5"})
    op.prepare_submit()
    assert apply_parser().parse_args(op.application_args).time_budget == seconds
    assert ("--time-budget" in _command(op)) is (seconds is not None)


@pytest.mark.parametrize("budget", [-1, "-0.5", "soon", "nan", "inf", True, [60]])
def test_apply_time_budget_that_is_not_seconds_fails_without_retry(dbs: Databases, budget: Any) -> None:
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    op = ApplyChangesOperator(task_id="a", subscription="s1", publications=["p1"], time_budget=budget,
                              publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                              conn_id=dbs.spark_conn)
    with pytest.raises(AirflowFailException, match=r"time_budget=.* is not a number of seconds of 0 or more"):
        op.prepare_submit()
    assert op.application_args is None  # nothing was submitted


def test_spec_json_is_what_the_job_parses(dbs: Databases) -> None:
    """The JSON on the command line round-trips through the jobs' own argument parser."""
    from airflow_provider_rowfilter.jobs.arguments import parse, parser

    op = RefreshPublicationOperator(task_id="r", subscription="s1", publications=["p1"],
                                    publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                    conn_id=dbs.spark_conn, copy_data=False, spark_conf={"spark.x": "1"})
    op.prepare_submit()
    _, spec = parse(parser("test"), op.application_args)
    assert spec.copy_data is False and spec.spark_conf == {"spark.x": "1"}
    assert json.loads(spec.to_json()) == json.loads(op.application_args[1])


@pytest.mark.parametrize("publisher", [
    pytest.param("postgresql://u@h/db?password={pw}", id="url-query"),
    pytest.param("postgresql://u@h/db?sslmode=disable&pass%77ord={pw}", id="url-query-percent-encoded-key"),
    pytest.param("'host=h user=u password={pw}'", id="key-value"),
    pytest.param("\"host=h password='{pw} x'\"", id="key-value-quoted"),
    pytest.param("'postgresql://u:{pw}@[::1/db'", id="malformed-url"),
])
def test_apply_operator_never_puts_a_password_on_the_command_line(dbs: Databases, tmp_path: Path, publisher: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Issue 14, item 7: a password in any form of the spec's connection string would reach the spark-submit,
    java and python command lines; it is refused before anything is submitted, and never shown."""
    import traceback

    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    hidden = "spec-Pa55word-9Wv3"
    (tmp_path / "s1.yaml").write_text(f"subscription: s1\npublications: [p1]\npublisher: {publisher.format(pw=hidden)}\n"
                                      f"subscriber_conn_id: {dbs.sub_conn}\n")
    op = ApplyChangesOperator(task_id="apply", spec=str(tmp_path / "s1.yaml"), conn_id=dbs.spark_conn, retries=3)
    with pytest.raises(AirflowFailException) as e:
        op.execute({})
    assert "the publisher of subscription 's1'" in str(e.value)
    assert hidden not in "".join(traceback.format_exception(e.value))
    assert hidden not in "\n".join(r.getMessage() for r in caplog.records)
    assert op.application_args is None  # nothing was submitted

    # From Airflow connections with passwords, the passwords go by environment only.
    ok = ApplyChangesOperator(task_id="apply", subscription="s1", publications=["p1"], publisher_conn_id=dbs.pub_conn,
                              subscriber_conn_id=dbs.sub_conn, conn_id=dbs.spark_conn)
    ok.prepare_submit()
    command = " ".join(_command(ok))
    for secret in (PUB_PASSWORD, SUB_PASSWORD):
        assert secret not in command and secret not in " ".join(ok.application_args)
    assert (ok.env_vars["ROWFILTER_PUBLISHER_PASSWORD"], ok.env_vars["ROWFILTER_SUBSCRIBER_PASSWORD"]) == (
        PUB_PASSWORD, SUB_PASSWORD)


# --- ApplyChangesOperator ---------------------------------------------------------------------------------
def test_apply_operator_fields_outlets_and_application() -> None:
    from airflow.sdk import AssetAlias

    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    parent = list(SparkSubmitOperator.template_fields)
    assert list(ApplyChangesOperator.template_fields[: len(parent)]) == parent
    assert {"spec", "subscription", "publications", "publisher_conn_id", "subscriber_conn_id", "change_log",
            "max_changes"} <= set(ApplyChangesOperator.template_fields)
    op = ApplyChangesOperator(task_id="a", subscription="s1", publications=["p1"], publisher_conn_id="nowhere",
                              subscriber_conn_id="nowhere", max_changes="{{ params.n }}")
    assert op.application == str(PACKAGE_DIR / "jobs" / "apply.py")
    assert op.application_args is None and op.env_vars is None  # nothing resolved at parse time
    assert op.outlets == [AssetAlias("rowfilter_s1")]  # one alias per subscription
    # A templated subscription is not known at parse time: the alias is the DAG author's to name.
    templated = ApplyChangesOperator(task_id="a", subscription="{{ params.s }}")
    assert templated.outlets == [] and templated.asset_alias is None
    named = ApplyChangesOperator(task_id="a", subscription="{{ params.s }}", asset_alias="orders_feed",
                                 outlets=[AssetAlias("other")])
    assert [o.name for o in named.outlets] == ["other", "orders_feed"]
    assert ApplyChangesOperator(task_id="a", subscription="s1", asset_alias="").outlets == []
    with pytest.raises(TypeError, match="sets application itself"):
        ApplyChangesOperator(task_id="a", application="x.py")


def test_apply_command_line(dbs: Databases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_rowfilter.jobs.apply import apply_parser
    from airflow_provider_rowfilter.jobs.arguments import spec_from_arguments
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    with DAG("rowfilter_apply_test", schedule=None) as dag:
        op = ApplyChangesOperator(task_id="apply", subscription="{{ params.s }}", publications="p1,p2",
                                  publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                  conn_id=dbs.spark_conn, max_changes="{{ params.n }}",
                                  change_log="{{ params.log }}")
    _render(op, {"s": "s_apply", "n": 500, "log": "changes/s_apply"})
    op.prepare_submit()
    command = _command(op)
    application = str(PACKAGE_DIR / "jobs" / "apply.py")
    assert command[command.index(application) + 1:] == [
        "--spec-json", command[command.index("--spec-json") + 1], "--max-changes", "500"]
    # The job's own parser reads exactly these arguments.
    args = apply_parser().parse_args(op.application_args)
    spec = spec_from_arguments(args)
    assert args.max_changes == 500
    assert spec.subscription == "s_apply" and spec.publications == ("p1", "p2")
    assert spec.change_log == str(Path(dag.folder) / "changes" / "s_apply")  # relative: from the DAG's folder
    for secret in (PUB_PASSWORD, SUB_PASSWORD):
        assert secret not in " ".join(command)
    assert op.env_vars["ROWFILTER_SUBSCRIBER_PASSWORD"] == SUB_PASSWORD

    # No change_log, no spec file: one directory under AIRFLOW_HOME, never the job's working directory.
    default = ApplyChangesOperator(task_id="apply", subscription="s_apply", publications=["p1"],
                                   publisher_conn_id=dbs.pub_conn, subscriber_conn_id=dbs.sub_conn,
                                   conn_id=dbs.spark_conn)
    default.prepare_submit()
    assert default.application_args[2:] == []  # the job's default bound
    assert SubscriptionSpec.from_json(default.application_args[1]).change_log == str(
        tmp_path / "home" / "rowfilter" / "s_apply" / "changes")

    # A spec file's change_log (relative to the file) comes through; the operator's overrides it.
    (tmp_path / "s1.yaml").write_text(f"subscription: s1\npublications: [p1]\npublisher_conn_id: {dbs.pub_conn}\n"
                                      f"subscriber_conn_id: {dbs.sub_conn}\nchange_log: log/s1\n")
    from_file = ApplyChangesOperator(task_id="apply", spec=str(tmp_path / "s1.yaml"), conn_id=dbs.spark_conn)
    from_file.prepare_submit()
    assert SubscriptionSpec.from_json(from_file.application_args[1]).change_log == str(tmp_path / "log" / "s1")
    override = ApplyChangesOperator(task_id="apply", spec=str(tmp_path / "s1.yaml"), conn_id=dbs.spark_conn,
                                    change_log=str(tmp_path / "elsewhere"))
    override.prepare_submit()
    assert SubscriptionSpec.from_json(override.application_args[1]).change_log == str(tmp_path / "elsewhere")


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"max_changes": 0}, "max_changes=0 is not a positive integer", id="zero"),
        pytest.param({"max_changes": "many"}, "max_changes='many' is not a positive integer", id="text"),
        pytest.param({"max_changes": True}, "max_changes=True is not a positive integer", id="bool"),
        pytest.param({"change_log": 5}, "change_log=5 is not a string", id="change-log-not-path"),
        pytest.param({"publisher_conn_id": "rf_nowhere"}, "publisher_conn_id='rf_nowhere': no such Airflow connection",
                     id="missing-connection"),
        pytest.param({"publications": []}, "subscription 's1' names no publications", id="no-publications"),
    ],
)
def test_apply_bad_spec_fails_without_retry(dbs: Databases, kwargs: dict[str, Any], expected: str) -> None:
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    base = {"subscription": "s1", "publications": ["p1"], "publisher_conn_id": dbs.pub_conn,
            "subscriber_conn_id": dbs.sub_conn}
    op = ApplyChangesOperator(task_id="apply", conn_id=dbs.spark_conn, retries=3, **{**base, **kwargs})
    with pytest.raises(AirflowFailException) as e:
        op.execute({})
    assert expected in str(e.value) and str(e.value).startswith("apply: ")
    assert op.application_args is None  # nothing was submitted


def test_the_job_s_lines_keep_their_level_and_its_error_is_kept() -> None:
    """Issue 18 item 5: lines as spark-submit printed them in a real conflict run; SparkSubmitHook logs
    each with ``log.info(line)``, and the JobOutput it is given logs it at the level it was written with."""
    from airflow_provider_rowfilter.hooks.job_output import JobOutput, job_failure

    class Recorder:
        def __init__(self) -> None:
            self.records: list[tuple[str, str]] = []

        def __getattr__(self, level: str) -> Callable[..., None]:
            return lambda msg, *args: self.records.append((level, msg % args if args else msg))

    lines = [
        ("info", "Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties"),
        ("warning", "26/11/24 23:33:56 WARN Utils: Set SPARK_LOCAL_IP if you need to bind to another address"),
        ("info", "26/11/24 23:34:17 INFO SparkContext: Running Spark version 4.2.0"),
        ("info", "INFO airflow_provider_rowfilter.publisher.capture: captured 2 changes in 1 transactions"),
        ("warning", "WARNING airflow_provider_rowfilter.subscriber.replica_role: session_replication_role stays origin: …"),
        ("warning", "/x/pyspark/sql/pandas/functions.py:777: FutureWarning: PySpark does not yet fully support pandas"),
        ("info", 'Setting Spark log level to "WARN".'),
        ("error", 'ERROR: table public.t1: conflict detected on relation "public.t1": conflict=insert_exists'),
        ("error", "DETAIL:  Key (a)=(8) already exists in the subscriber; remote transaction 783 finished at 0/2F75C98."),
        ("error", "HINT:  remove or change the subscriber's row and run again"),
        ("info", "INFO py4j.clientserver: Closing down clientserver connection"),
    ]
    recorder = Recorder()
    output = JobOutput(recorder)
    for _, line in lines:
        output.info(line)  # what SparkSubmitHook._process_spark_submit_log calls
    output.info("Identified spark driver id: %s", "driver-1")  # the hook's own messages pass through
    assert recorder.records == [*lines, ("info", "Identified spark driver id: driver-1")]
    assert output.error_text == ('table public.t1: conflict detected on relation "public.t1": conflict=insert_exists\n'
                                 "DETAIL:  Key (a)=(8) already exists in the subscriber; remote transaction 783 "
                                 "finished at 0/2F75C98.\nHINT:  remove or change the subscriber's row and run again")
    hooks_own = RuntimeError("Cannot execute: spark-submit --master local[2] … Error code is: 1.")
    assert isinstance(job_failure(output, 1, hooks_own), AirflowFailException)
    retried = job_failure(output, 75, hooks_own)
    assert not isinstance(retried, AirflowFailException) and str(retried) == output.error_text
    assert job_failure(JobOutput(recorder), 1, hooks_own) is hooks_own  # a crash without our ERROR: retries


def test_apply_in_the_task_takes_the_store_s_credentials_from_its_connection(
        dbs: Databases, tmp_path: Path, s3: Any, s3_log: str, airflow_conn: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 32: the change log in a bucket, the workers' environment without the store's keys: the task's own run
    captures and applies with the credentials of the ``aws`` connection named by change_log_conn_id."""
    from airflow_provider_rowfilter.change_log.store import open_change_log
    from airflow_provider_rowfilter.flows.apply.drain import apply
    from airflow_provider_rowfilter.flows.refresh import refresh
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    with psycopg.connect(dbs.sub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (a int PRIMARY KEY, b text); CREATE TABLE t2 (id int PRIMARY KEY, region text)")
    (tmp_path / "s3.yaml").write_text("subscription: s_s3\npublications: [p1, p2]\nfiltering: source\n"
                                      f"copy_data: false\nchange_log: {s3_log}\n")
    spec = SubscriptionSpec(subscription="s_s3", publications=("p1", "p2"), publisher=dbs.pub, subscriber=dbs.sub,
                            filtering="source", copy_data=False, change_log=s3_log)
    refresh(spec)
    apply(spec)  # the first run records the log the subscriber is fed from (with the run's own AWS_* keys)
    aws = airflow_conn({"conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
                        "extra": {"region_name": "us-east-1", "endpoint_url": s3.endpoint}}, "aws")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key)
    with psycopg.connect(dbs.pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (7, 'b7'), (0, 'filtered out'); INSERT INTO t2 VALUES (1, 'EU')")
    op = ApplyChangesOperator(task_id="apply", spec=str(tmp_path / "s3.yaml"), publisher_conn_id=dbs.pub_conn,
                              subscriber_conn_id=dbs.sub_conn, conn_id=dbs.spark_conn, change_log_conn_id=aws)
    caplog.set_level("INFO")
    result = op.execute({})
    assert "applied s_s3: 1 batch(es), 2 changes" in caplog.text  # by the task itself (flows/apply/drain.py, in process)
    assert result["counts"]["public.t1"]["insert"] == 1 and result["counts"]["public.t2"]["insert"] == 1
    with psycopg.connect(dbs.sub) as conn:
        assert conn.execute("SELECT a, b FROM t1 ORDER BY a").fetchall() == [(7, "b7")]
    assert "AWS_ACCESS_KEY_ID" not in os.environ  # the connection's keys were the task's run's alone
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    assert open_change_log(spec).segments()  # the segments went to the bucket
