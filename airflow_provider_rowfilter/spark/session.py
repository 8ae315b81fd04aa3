"""Build the SparkSession our PySpark jobs run in, with the PostgreSQL JDBC driver on the classpath."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.spec import with_jvm_options

logger = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
#: Spark's log level unless the spec's spark_conf sets ``spark.log.level``.
DEFAULT_LOG_LEVEL = "WARN"
#: Debian's libpostgresql-jdbc-java installs the driver here.
DEBIAN_JDBC_JAR = Path("/usr/share/java/postgresql.jar")
#: Environment variable naming another PostgreSQL JDBC jar (e.g. one downloaded from Maven Central).
JDBC_JAR_ENV = "ROWFILTER_JDBC_JAR"
JDBC_DRIVER_CLASS = "org.postgresql.Driver"
#: HotSpot's ``HugeMethodLimit``: the largest method its JIT compilers take on by default.
HUGE_METHOD_LIMIT = "8000"


class JdbcDriverNotFoundError(RowFilterError):
    """The PostgreSQL JDBC driver jar is not where Spark is told to load it from."""


def jdbc_jar_path() -> Path:
    """Return the PostgreSQL JDBC driver jar: ``$ROWFILTER_JDBC_JAR``, else Debian's package."""
    configured = os.environ.get(JDBC_JAR_ENV)
    if configured:
        jar = Path(configured)
        if not jar.is_file():
            raise JdbcDriverNotFoundError(
                f"{JDBC_JAR_ENV}={configured!r} is not a file",
                hint=f"point {JDBC_JAR_ENV} at a postgresql-*.jar, or unset it to use {DEBIAN_JDBC_JAR}",
            )
        return jar
    if DEBIAN_JDBC_JAR.is_file():
        return DEBIAN_JDBC_JAR
    raise JdbcDriverNotFoundError(
        f"the PostgreSQL JDBC driver is not installed: {DEBIAN_JDBC_JAR} does not exist",
        hint=f"apt-get install -y libpostgresql-jdbc-java (or set {JDBC_JAR_ENV} to a postgresql-*.jar)",
    )


def session_conf(master: str | None = None, conf: Mapping[str, str] | None = None, *,
                 short_batch: bool = False) -> dict[str, str]:
    """Return the Spark configuration :func:`build_session` applies, caller's ``conf`` last.

    :param master: Spark master URL; default ``local[*]``.
    :param conf: extra settings, e.g. ``{"spark.ui.enabled": "false"}``; a ``spark.jars`` given
        here is kept and the JDBC jar appended to it.
    :param short_batch: the session runs one short apply batch (core/spec.py ``SHORT_BATCH_JVM_OPTIONS``).
    """
    settings = {
        "spark.master": master or DEFAULT_MASTER,
        "spark.sql.session.timeZone": "UTC",
        # Spark's advice for HotSpot: run a plan whose whole-stage method would exceed HotSpot's
        # 8,000-byte limit without whole-stage codegen. The apply's judging stage is 26 KB; left whole,
        # it made HotSpot give up compiling it in some JVMs (docs/apply.md, "Speed").
        "spark.sql.codegen.hugeMethodLimit": HUGE_METHOD_LIMIT,
        # The apply collects each key's changes (collect_list): nearly every key is distinct, so the
        # hash-based object aggregate falls back to sorting anyway; sorting from the start is cheaper
        # (the reduce-and-stage step of a 280k batch: median 2.15 s against 2.5 s).
        "spark.sql.execution.useObjectHashAggregateExec": "false",
        # Spark's own log at WARN, as Spark sets it for a shell (the `rowfilter` command's session): under
        # spark-submit it would be INFO, hundreds of lines an operator's task log shows before the job's
        # own. A spark_conf setting wins (spark.log.level: INFO).
        "spark.log.level": DEFAULT_LOG_LEVEL,
    }
    if settings["spark.master"].startswith("local"):
        # Everything runs in this JVM: keep the driver's ports on loopback instead of the address
        # the host name resolves to.
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf or {})
    # The JVMs' own zone (the JDBC driver and java.time conversions read it) and the JIT for long
    # generated methods, added to the caller's Java options (core/spec.py SPARK_JVM_OPTIONS).
    settings = with_jvm_options(settings, short_batch=short_batch)
    jar = str(jdbc_jar_path())
    jars = [j for j in settings.get("spark.jars", "").split(",") if j]
    if jar not in jars:
        jars.append(jar)
    settings["spark.jars"] = ",".join(jars)
    # spark.jars alone loads the driver in a child class loader that java.sql.DriverManager does not
    # search, so a read without an explicit "driver" option fails with "No suitable driver".
    for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
        entries = [e for e in settings.get(key, "").split(os.pathsep) if e]
        if jar not in entries:
            entries.append(jar)
        settings[key] = os.pathsep.join(entries)
    return settings


def build_session(
    app_name: str, master: str | None = None, conf: Mapping[str, str] | None = None, *, short_batch: bool = False
) -> SparkSession:
    """Build (or get) the SparkSession for a job: UTC, PostgreSQL JDBC driver on the classpath.

    Static settings (master, jars, JVM options) only take effect when no session is running
    in this process yet; :meth:`SparkSession.builder.getOrCreate` keeps the existing one.

    :param app_name: Spark application name.
    :param master: Spark master URL; default ``local[*]``.
    :param conf: extra Spark settings, applied last (``{"spark.ui.enabled": "false"}`` in tests).
    :param short_batch: the session runs one short apply batch and stops; its JVM compiles for a short life.
    """
    builder = SparkSession.builder.appName(app_name)
    settings = session_conf(master, conf, short_batch=short_batch)
    if settings["spark.master"].startswith("local"):
        # The Python workers of a local master run here: give them this interpreter and its packages
        # (psycopg for the copy's writers), not whichever `python3` comes first on PATH. PySpark reads
        # the variable when the context starts; an explicit setting wins.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    logger.info("Spark session %r on %s (Spark %s)", app_name, session.sparkContext.master, session.version)
    return session
