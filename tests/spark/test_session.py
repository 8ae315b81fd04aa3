"""The Spark session our jobs use: its settings, on a running session and as built."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_rowfilter.spark.session import SESSION_REUSE_SECONDS, reused_session_id, session_conf


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
    assert "spark.ui.enabled" not in conf  # the UI stays on unless asked
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


def test_a_job_s_connect_session_is_one_per_period_job_subscription_and_settings() -> None:
    """spark/session.py reused_session_id: what decides which server-side session a Spark Connect run attaches to."""
    start = 1_000 * SESSION_REUSE_SECONDS  # the start of a period
    one = reused_session_id("s1", "apply", {"spark.sql.shuffle.partitions": "2"}, start)
    assert reused_session_id("s1", "apply", {"spark.sql.shuffle.partitions": "2"}, start + SESSION_REUSE_SECONDS - 1) == one
    assert len({one,
                reused_session_id("s1", "apply", {"spark.sql.shuffle.partitions": "2"}, start + SESSION_REUSE_SECONDS),
                reused_session_id("s1", "snapshot", {"spark.sql.shuffle.partitions": "2"}, start),
                reused_session_id("s2", "apply", {"spark.sql.shuffle.partitions": "2"}, start),
                reused_session_id("s1", "apply", {"spark.sql.shuffle.partitions": "3"}, start)}) == 5
    assert str(uuid.UUID(one)) == one  # what pyspark's ChannelBuilder takes
