"""The Spark session our jobs use: its settings, on a running session and as built."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_rowfilter.spark.session import SESSION_REUSE_SECONDS, _with_token, reused_session_id, session_conf
from airflow_provider_rowfilter.spark.settings import EXCLUDED_OPTIMIZER_RULES


def test_a_users_excluded_optimizer_rules_are_kept_beside_ours() -> None:
    rules = session_conf(conf={"spark.sql.optimizer.excludedRules": "a.B, c.D"})["spark.sql.optimizer.excludedRules"]
    assert rules == ",".join([*EXCLUDED_OPTIMIZER_RULES, "a.B", "c.D"])
    assert "org.apache.spark.sql.catalyst.optimizer.UnwrapCastInBinaryComparison" in EXCLUDED_OPTIMIZER_RULES


def test_session_settings(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert spark.sparkContext.master == "local[2]"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    # A whole-stage method HotSpot would not compile well runs without whole-stage codegen instead.
    assert spark.conf.get("spark.sql.codegen.hugeMethodLimit") == "8000"
    # The apply's per-key collect_list sorts rather than hashing nearly distinct keys.
    assert spark.conf.get("spark.sql.execution.useObjectHashAggregateExec") == "false"
    assert spark.conf.get("spark.sql.codegen.cache.maxEntries") == "2000"  # spark/settings.py STATIC_SQL_SETTINGS
    # Spark's optimizer may not prove what PostgreSQL's planner does not (spark/settings.py EXCLUDED_OPTIMIZER_RULES).
    assert spark.conf.get("spark.sql.optimizer.excludedRules") == ",".join(EXCLUDED_OPTIMIZER_RULES)
    assert conf.get("spark.ui.enabled") == "false"
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    assert jvm.java.util.TimeZone.getDefault().getID() == "UTC"
    # HotSpot compiles Spark's long generated methods instead of interpreting them (docs/apply.md, "Speed").
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:-DontCompileHugeMethods" in arguments
    assert jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.com.sun.management.HotSpotDiagnosticMXBean._java_lang_class).getVMOption(
        "DontCompileHugeMethods").getValue() == "false"
    # … and C2 does not throw the hot generated code back to the interpreter on an untaken branch.
    assert jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.com.sun.management.HotSpotDiagnosticMXBean._java_lang_class).getVMOption(
        "PerMethodTrapLimit").getValue() == "0"


def test_compiled_code_is_kept_for_more_than_one_job_s_plans(spark: SparkSession) -> None:
    """Spark keeps 100 compiled classes by default: a second job's plans (another subscription's batch on one
    Connect server) would evict the first's, compiled again at its next run. Here 150 other plans run between
    two runs of one query, and the second compiles nothing."""
    compiled = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def run(n: int) -> None:
        spark.range(0, 8, 1, 1).selectExpr(f"id * {n} + {n} AS v", f"CAST(id AS string) || '{n}' AS s").collect()

    run(0)
    others = compiled.getCount()
    for n in range(1, 151):
        run(n)
    assert compiled.getCount() - others >= 150  # each of them compiled (its literals are in its code)
    before = compiled.getCount()
    run(0)
    assert compiled.getCount() == before


def test_session_conf_keeps_callers_settings() -> None:
    conf = session_conf(None, {"spark.jars": "/opt/other.jar", "spark.sql.session.timeZone": "Europe/Paris",
                               "spark.sql.codegen.hugeMethodLimit": "65535"})
    assert conf["spark.master"] == "local[*]"
    assert conf["spark.jars"] == "/opt/other.jar"
    assert "spark.driver.extraClassPath" not in conf
    assert conf["spark.sql.session.timeZone"] == "Europe/Paris"
    assert conf["spark.sql.codegen.hugeMethodLimit"] == "65535"
    assert session_conf(None)["spark.sql.codegen.hugeMethodLimit"] == "8000"
    assert conf["spark.ui.enabled"] == "false"  # a local master's UI is off unless asked (tests/spark/test_spark_ui.py)
    assert conf["spark.driver.extraJavaOptions"] == (
        "-Duser.timezone=UTC -XX:-DontCompileHugeMethods -XX:PerMethodTrapLimit=0")


def test_session_conf_adds_jvm_options_to_the_callers_own() -> None:
    conf = session_conf(None, {"spark.executor.extraJavaOptions": "-Xss4m -Duser.timezone=Europe/Paris",
                               "spark.driver.extraJavaOptions": "-XX:+DontCompileHugeMethods -XX:PerMethodTrapLimit=100"})
    # The caller's options stay, and a setting the caller made itself is not overridden.
    assert conf["spark.executor.extraJavaOptions"] == (
        "-Xss4m -Duser.timezone=Europe/Paris -XX:-DontCompileHugeMethods -XX:PerMethodTrapLimit=0")
    assert conf["spark.driver.extraJavaOptions"] == (
        "-XX:+DontCompileHugeMethods -XX:PerMethodTrapLimit=100 -Duser.timezone=UTC")


def test_a_session_for_a_short_batch_compiles_for_a_short_life_unless_told_otherwise() -> None:
    conf = session_conf(None, {"spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=4"}, short_batch=True)
    assert conf["spark.driver.extraJavaOptions"] == (
        "-Duser.timezone=UTC -XX:-DontCompileHugeMethods -XX:PerMethodTrapLimit=0 -XX:TieredStopAtLevel=1")
    assert conf["spark.executor.extraJavaOptions"] == (
        "-XX:TieredStopAtLevel=4 -Duser.timezone=UTC -XX:-DontCompileHugeMethods -XX:PerMethodTrapLimit=0")


def test_a_session_needs_no_jdbc_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # No job reads or writes over JDBC (the copy and the apply use psycopg): a session is built
    # without the PostgreSQL JDBC jar, wherever the old ROWFILTER_JDBC_JAR pointed.
    monkeypatch.setenv("ROWFILTER_JDBC_JAR", str(tmp_path / "missing.jar"))
    conf = session_conf(None)
    assert "spark.jars" not in conf
    assert "spark.driver.extraClassPath" not in conf
    assert "spark.executor.extraClassPath" not in conf


def test_spark_logs_warnings_only_unless_told_otherwise() -> None:
    """Issue 18 item 5: under spark-submit Spark's default is INFO (hundreds of lines in a task's log)."""
    assert session_conf(None)["spark.log.level"] == "WARN"
    assert session_conf(None, {"spark.log.level": "INFO"})["spark.log.level"] == "INFO"


TOKEN = "a-servers-token-0123456789"


def test_a_job_s_connect_session_is_one_per_period_job_subscription_and_settings() -> None:
    """spark/session.py reused_session_id: what decides which server-side session a Spark Connect run attaches to."""
    start = 1_000 * SESSION_REUSE_SECONDS  # the start of a period
    conf = {"spark.sql.shuffle.partitions": "2"}
    one = reused_session_id(TOKEN, "s1", "apply", conf, start)
    assert reused_session_id(TOKEN, "s1", "apply", conf, start + SESSION_REUSE_SECONDS - 1) == one
    assert len({one,
                reused_session_id(TOKEN, "s1", "apply", conf, start + SESSION_REUSE_SECONDS),
                reused_session_id(TOKEN, "s1", "snapshot", conf, start),
                reused_session_id(TOKEN, "s2", "apply", conf, start),
                reused_session_id(TOKEN, "s1", "apply", {"spark.sql.shuffle.partitions": "3"}, start)}) == 5
    assert str(uuid.UUID(one)) == one and uuid.UUID(one).version == 4  # what the server takes as a session id


def test_a_connect_session_id_cannot_be_computed_without_the_server_s_token() -> None:
    """Issue 28, item 2: the id was a uuid5 of the subscription, job, half hour and settings, which anyone who knew
    the subscription's name could compute and attach to. Now it is an HMAC under the server's token; without a
    token there is no reused session at all (each run a random one, released)."""
    start = 1_000 * SESSION_REUSE_SECONDS
    conf = {"spark.sql.shuffle.partitions": "2"}
    one = reused_session_id(TOKEN, "s1", "apply", conf, start)
    assert reused_session_id(TOKEN + "x", "s1", "apply", conf, start) != one
    assert one != str(uuid.uuid5(uuid.UUID("6b2f0d3e-8f63-4c4e-9a53-2f7d3c1a9e10"), f"s1\0apply\0{1000}\0"
                                 "spark.sql.shuffle.partitions=2"))  # the old id
    assert reused_session_id(None, "s1", "apply", conf, start) is None
    assert reused_session_id("", "s1", "apply", conf, start) is None


@pytest.mark.parametrize(("remote", "expected"), [
    ("sc://127.0.0.1:15002", "sc://localhost:15002/;token=T"),
    ("sc://[::1]:15002/;user_id=etl", "sc://localhost:15002/;user_id=etl;token=T"),
    ("sc://localhost", "sc://localhost:15002/;token=T"),
    ("sc://spark.example:15002/;use_ssl=true", "sc://spark.example:15002/;use_ssl=true;token=T"),
    ("sc://127.0.0.1:15002/;use_ssl=true", "sc://127.0.0.1:15002/;use_ssl=true;token=T"),
], ids=["loopback", "ipv6-loopback", "no-port", "remote-tls", "loopback-tls"])
def test_a_token_goes_with_the_url_and_loopback_is_named_localhost(remote: str, expected: str) -> None:
    """pyspark's client sends a token without TLS only to ``localhost`` (gRPC local credentials); to any other name
    it insists on TLS, which the local server has not."""
    assert _with_token(remote, "T") == expected
    assert _with_token(remote, None) == remote
