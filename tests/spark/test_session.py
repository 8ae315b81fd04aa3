"""The Spark session our jobs use: settings, and a real JDBC round trip to the local PostgreSQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from airflow_provider_rowfilter.pg.embedded import LocalPostgres
from airflow_provider_rowfilter.spark import session as session_module
from airflow_provider_rowfilter.spark.session import JdbcDriverNotFoundError, jdbc_jar_path, session_conf
from tests.dataframes import assert_dataframe_equal

ROWS = [
    (
        1,
        10_000_000_000,
        "plain",
        Decimal("12.50"),
        True,
        dt.date(2024, 2, 29),
        dt.datetime(2024, 3, 31, 1, 30, 0),
    ),
    (
        2,
        -1,
        "ünïcödé ✓",
        Decimal("-0.01"),
        False,
        dt.date(1999, 12, 31),
        dt.datetime(2000, 1, 1, 0, 0, 0, 123456),
    ),
    (3, None, None, None, None, None, None),
    (4, 0, "", Decimal("0.00"), True, dt.date(1970, 1, 1), dt.datetime(1970, 1, 1, 0, 0, 0)),
]
SCHEMA = "id int, big long, s string, amount decimal(10,2), flag boolean, day date, at timestamp"


def _jdbc_props() -> dict[str, str]:
    return {"user": "postgres", "driver": "org.postgresql.Driver"}


def test_session_settings(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert spark.sparkContext.master == "local[2]"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    # A whole-stage method HotSpot would not compile well runs without whole-stage codegen instead.
    assert spark.conf.get("spark.sql.codegen.hugeMethodLimit") == "8000"
    # The apply's per-key collect_list sorts rather than hashing nearly distinct keys.
    assert spark.conf.get("spark.sql.execution.useObjectHashAggregateExec") == "false"
    assert conf.get("spark.ui.enabled") == "false"
    assert str(jdbc_jar_path()) in conf.get("spark.jars", "").split(",")
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
    # The driver class is visible to java.sql.DriverManager, not only to Spark's own class loader.
    assert jvm.java.sql.DriverManager.getDriver("jdbc:postgresql://127.0.0.1/x").getClass().getName() == (
        "org.postgresql.Driver"
    )


def test_jdbc_round_trip(spark: SparkSession, local_pg: LocalPostgres, fresh_db: Callable[..., str]) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(fresh_db())["dbname"]
    assert isinstance(dbname, str)
    url = local_pg.jdbc_url(dbname)
    expected = spark.createDataFrame(ROWS, SCHEMA)

    expected.write.jdbc(url, "public.round_trip", mode="error", properties=_jdbc_props())
    with psycopg.connect(local_pg.dsn(dbname)) as conn:
        stored = conn.execute("SELECT id, s, at FROM public.round_trip WHERE id = 2").fetchone()
    # Spark's TimestampType is an instant: PostgreSQL stores it as timestamptz, in UTC here.
    assert stored == (2, "ünïcödé ✓", dt.datetime(2000, 1, 1, 0, 0, 0, 123456, tzinfo=dt.timezone.utc))

    # Without the "driver" property and in two partitions, as the copy jobs read.
    back = spark.read.jdbc(
        url,
        "public.round_trip",
        column="id",
        lowerBound=1,
        upperBound=4,
        numPartitions=2,
        properties={"user": "postgres"},
    )
    assert back.rdd.getNumPartitions() == 2
    assert_dataframe_equal(back, expected)


def test_session_conf_keeps_callers_settings_and_adds_the_jar() -> None:
    conf = session_conf(None, {"spark.jars": "/opt/other.jar", "spark.sql.session.timeZone": "Europe/Paris",
                               "spark.sql.codegen.hugeMethodLimit": "65535"})
    jar = str(jdbc_jar_path())
    assert conf["spark.master"] == "local[*]"
    assert conf["spark.jars"] == f"/opt/other.jar,{jar}"
    assert conf["spark.driver.extraClassPath"] == jar
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


def test_missing_debian_jar_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(session_module.JDBC_JAR_ENV, raising=False)
    monkeypatch.setattr(session_module, "DEBIAN_JDBC_JAR", tmp_path / "postgresql.jar")
    with pytest.raises(JdbcDriverNotFoundError, match="is not installed") as info:
        jdbc_jar_path()
    assert "apt-get install -y libpostgresql-jdbc-java" in str(info.value)


def test_jar_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jar = tmp_path / "postgresql-42.7.jar"
    monkeypatch.setenv(session_module.JDBC_JAR_ENV, str(jar))
    with pytest.raises(JdbcDriverNotFoundError, match="ROWFILTER_JDBC_JAR=.* is not a file"):
        jdbc_jar_path()
    jar.write_bytes(b"")
    assert jdbc_jar_path() == jar


def test_spark_logs_warnings_only_unless_told_otherwise() -> None:
    """Issue 18 item 5: under spark-submit Spark's default is INFO (hundreds of lines in a task's log)."""
    assert session_conf(None)["spark.log.level"] == "WARN"
    assert session_conf(None, {"spark.log.level": "INFO"})["spark.log.level"] == "INFO"
