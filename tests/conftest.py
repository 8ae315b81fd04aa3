"""Session-wide fixtures: one local PostgreSQL cluster and one Spark session per test run."""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
from tests.pg_versions import pg16_bin_dir, pg17_bin_dir
from tests.reaper import reaped
from tests.replication_origins import drop_origins
from tests.roles import ROLES, PasswordRole
from tests.s3_server import S3Server, s3_server

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_rowfilter.spark.connect_server import ServerInfo

# Start-up costs, reported at the end of the run (timing belongs in bench/, not in assertions).
_timings: dict[str, float] = {}
_db_counter = itertools.count(1)

SPARK_TEST_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # The run's one driver parses thousands of distinct filter projections (the differential properties): ANTLR's
    # prediction cache, unbounded by default, kept 600 MB of the 1 GB heap after 300 numeric filters and the JVM
    # died of it; flushed past a tenth of the heap, it stays under 100 MB (and parses faster, with less GC).
    "spark.sql.parser.manageParserCaches": "true",
    "spark.sql.parser.parserDfaCacheFlushRatio": "10",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by the expensive fixtures they use, so ``-m "not spark"`` gives a quick run."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if any(f in fixtures for f in ("local_pg", "fresh_db", "local_pg16", "fresh_db16", "local_pg17", "fresh_db17")):
            item.add_marker(pytest.mark.postgres)
        if "spark" in fixtures:
            item.add_marker(pytest.mark.spark)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report how long the shared PostgreSQL cluster and Spark session took to start."""
    if _timings:
        text = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in _timings.items())
        terminalreporter.write_line(f"start-up: {text}")


@pytest.fixture(scope="session", autouse=True)
def no_class_archives() -> Iterator[None]:
    """No driver class archives (spark/class_archive.py) unless a test asks for them in a directory of its own:
    none in the user's ~/.cache, no test's command line depending on what an earlier run left there, and no
    run paying the seconds of making one."""
    from airflow_provider_rowfilter.spark.class_archive import ARCHIVE_DIR_ENV

    before = os.environ.get(ARCHIVE_DIR_ENV)
    os.environ[ARCHIVE_DIR_ENV] = "off"
    yield
    if before is None:
        os.environ.pop(ARCHIVE_DIR_ENV, None)
    else:
        os.environ[ARCHIVE_DIR_ENV] = before


@pytest.fixture(scope="session")
def local_pg() -> Iterator[LocalPostgres]:
    """Return the run's one PostgreSQL cluster (logical replication on, SCRAM for every connection), stopped
    at the end. Its superuser's password file is the run's ``PGPASSFILE`` (as a user keeps ~/.pgpass), so
    that the tests' own setup and the native referee connect as the superuser; the jobs connect as the
    password roles of tests/roles.py (:func:`password_roles`)."""
    with LocalPostgres.start() as pg:
        _timings[f"local PostgreSQL {pg.version_num}"] = pg.startup_seconds
        before = os.environ.get("PGPASSFILE")
        os.environ["PGPASSFILE"] = str(pg.passfile)
        try:
            yield pg
        finally:
            if before is None:
                os.environ.pop("PGPASSFILE", None)
            else:
                os.environ["PGPASSFILE"] = before


@pytest.fixture(scope="session")
def password_roles(local_pg: LocalPostgres) -> dict[str, PasswordRole]:
    """The run's two password roles (tests/roles.py), ``{"publisher": …, "subscriber": …}``, made once."""
    for role in ROLES.values():
        local_pg.create_role(role.name, role.password, superuser=True, replication=True)
    return ROLES


@pytest.fixture
def fresh_db(local_pg: LocalPostgres, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """Return a factory ``fresh_db(name=None) -> dsn`` of empty databases, dropped after the test.

    Databases are dropped newest first, so a subscriber database goes (with its subscriptions)
    before the publisher database whose slot it uses.
    """
    created: list[str] = []

    def make(name: str | None = None) -> str:
        if name is None:
            stem = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())[:40]
            name = f"t_{stem}_{next(_db_counter)}"
        dsn = local_pg.create_database(name)
        created.append(name)
        return dsn

    yield make
    for name in reversed(created):
        local_pg.drop_database(name)
    drop_origins(local_pg)


@pytest.fixture(scope="session")
def local_pg16() -> Iterator[LocalPostgres]:
    """A PostgreSQL 16 cluster beside the run's 18 one, for the tests that hold us to a 16 publisher (and a 16
    native referee): the ``pgserver`` wheel's 16.2 server (pgoutput, walreceiver), started once, on first use
    (about 2 s). Its URLs carry their own password file, as the 18 cluster's do."""
    with LocalPostgres.start(bin_dir=pg16_bin_dir()) as pg:
        _timings[f"local PostgreSQL {pg.version_num}"] = pg.startup_seconds
        yield pg


@pytest.fixture
def fresh_db16(local_pg16: LocalPostgres, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """:func:`fresh_db` on the PostgreSQL 16 cluster."""
    yield from _fresh_databases(local_pg16, "t16", request)


@pytest.fixture(scope="session")
def local_pg17() -> Iterator[LocalPostgres]:
    """A PostgreSQL 17 cluster beside the run's 18 one (17.10, the first release with failover
    slots, tests/pg_versions.py), for a 17 publisher and subscriber and their 17 native referee; started once, on first
    use (about 1 s)."""
    with LocalPostgres.start(bin_dir=pg17_bin_dir()) as pg:
        assert pg.version_num // 10000 == 17, pg.version_num
        _timings[f"local PostgreSQL {pg.version_num}"] = pg.startup_seconds
        yield pg


@pytest.fixture
def fresh_db17(local_pg17: LocalPostgres, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """:func:`fresh_db` on the PostgreSQL 17 cluster."""
    yield from _fresh_databases(local_pg17, "t17", request)


def _fresh_databases(pg: LocalPostgres, prefix: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    created: list[str] = []

    def make() -> str:
        stem = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())[:40]
        name = f"{prefix}_{stem}_{next(_db_counter)}"
        created.append(name)
        return pg.create_database(name)

    yield make
    for name in reversed(created):
        pg.drop_database(name)
    drop_origins(pg)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """Return the run's one SparkSession: local[2], 2 shuffle partitions, UI off, UTC."""
    # Imported here so that runs without Spark tests never start a JVM.
    from airflow_provider_rowfilter.spark.session import build_session

    began = time.monotonic()
    session = build_session("airflow-provider-rowfilter-tests", master="local[2]", conf=SPARK_TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    _timings["Spark session"] = time.monotonic() - began
    yield session
    session.stop()
    # py4j closes its last connection when the interpreter exits and logs that at INFO; by then a job
    # run in process (logging.basicConfig at INFO) has left the root logger writing to pytest's
    # closed capture stream, which prints a "--- Logging error ---" traceback after the summary.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def spark_connect_server() -> Iterator[ServerInfo]:
    """The run's one local Spark Connect server (started only when a test asks). It answers only its token,
    which is the run's ``SPARK_CONNECT_AUTHENTICATE_TOKEN`` (as a user exports it, or an operator sets it from
    the ``spark_connect`` connection), so that every job process of the run finds it."""
    from airflow_provider_rowfilter.core.spec.spark_remote import SPARK_CONNECT_TOKEN_ENV
    from airflow_provider_rowfilter.spark import connect_server

    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # In a folder another OS user may enter (pytest's are 0700), so that the tests that attack the server's files
    # (tests/spark/test_connect_security.py) meet the state directory's own mode.
    base = Path(tempfile.mkdtemp(prefix="rowfilter-spark-connect-"))
    base.chmod(0o755)
    state = base / "state"
    began = time.monotonic()
    info = connect_server.start(state, port=port, master="local[2]", conf=SPARK_TEST_CONF)
    _timings["Spark Connect server"] = time.monotonic() - began
    before = os.environ.get(SPARK_CONNECT_TOKEN_ENV)
    os.environ[SPARK_CONNECT_TOKEN_ENV] = Path(info.token_file).read_text().strip()
    try:
        with reaped(info.pid):
            yield info
    finally:
        if before is None:
            os.environ.pop(SPARK_CONNECT_TOKEN_ENV, None)
        else:
            os.environ[SPARK_CONNECT_TOKEN_ENV] = before
        connect_server.stop(state)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def spark_connect_url(spark_connect_server: ServerInfo) -> str:
    """Return the ``sc://`` URL of the run's one local Spark Connect server (:func:`spark_connect_server`)."""
    return spark_connect_server.url


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """The run's S3-compatible server on 127.0.0.1 (moto's, a process of its own: tests/s3_server.py), its
    credentials and endpoint in the run's environment (``AWS_*``), as a deployment gives them to every job."""
    began = time.monotonic()
    with s3_server() as server:
        _timings["S3-compatible server"] = round(time.monotonic() - began, 2)
        saved = {k: os.environ.get(k) for k in server.environment()}
        os.environ.update(server.environment())
        try:
            yield server
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture
def s3_log(s3: S3Server) -> str:
    """A change-log URL in a bucket of its own: ``s3://<bucket>/subs/changes``."""
    return f"s3://{s3.bucket()}/subs/changes"
