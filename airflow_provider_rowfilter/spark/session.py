"""Build the SparkSession our PySpark jobs run in: UTC, loopback for a local master (its web UI off unless asked
for, then on 127.0.0.1 without kill links), the JVM options.

With the spec's ``spark_remote`` (``sc://host:port``) the session is a Spark Connect client of a
running server instead: no JVM in this process, the server's warm JIT and caches reused from run to
run. Only SQL settings reach a Connect session; the JVM options and Spark core settings are the
server's (``rowfilter spark-server start``, spark/connect_server.py). The client sends the server's token
(spark/connect_server.py ``token_of``), and the runs of one job of one subscription attach to one
server-side session whose id only a holder of that token can compute (:func:`reused_session_id`), so the
Python workers the server started for it (a copy's, a large batch's) serve the next run too. Without a
token each run takes a new, random session and releases it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any, cast

from pyspark import SparkContext
from pyspark.sql import SparkSession

from airflow_provider_rowfilter.core.errors import RowFilterError, SparkAuthenticationError, SpecError
from airflow_provider_rowfilter.core.spec.spark_remote import remote_params, with_remote_params
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.spark.class_archive import mark_session
from airflow_provider_rowfilter.spark.executor_wait import watch_executors
from airflow_provider_rowfilter.spark.remote import remote_address, require_server
from airflow_provider_rowfilter.spark.settings import (
    EXCLUDED_OPTIMIZER_RULES,
    EXCLUDED_RULES_SETTING,
    LOOPBACK,
    SMALL_BATCH_SQL_SETTINGS,
    STATIC_SQL_SETTINGS,
    UI_ADDRESS_ENV,
    is_local,
    network_security,
    private_local_dir,
    ui_settings,
    wants_local_dir,
    with_jvm_options,
)

logger = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
#: Spark's log level unless the spec's spark_conf sets ``spark.log.level``.
DEFAULT_LOG_LEVEL = "WARN"
#: HotSpot's ``HugeMethodLimit``: the largest method its JIT compilers take on by default.
HUGE_METHOD_LIMIT = "8000"
#: How long the runs of a job attach to one Spark Connect session: shorter than the server's idle timeout
#: (``spark.connect.session.manager.defaultSessionTimeout``, 60 minutes by default), after which the
#: server closes a session and refuses its id for good.
SESSION_REUSE_SECONDS = 1800
#: The host names of this machine's loopback, which pyspark's client reaches with a token and without TLS
#: under the name ``localhost`` only (spark/connect_server.py ``URL_HOST``).
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")


def session_conf(master: str | None = None, conf: Mapping[str, str] | None = None, *,
                 short_batch: bool = False, launched: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the Spark configuration :func:`build_session` applies, caller's ``conf`` last.

    :param master: Spark master URL; default ``local[*]``.
    :param conf: extra settings, e.g. ``{"spark.ui.enabled": "true"}`` (a local master's UI is off unless asked).
    :param short_batch: the session runs one short apply batch (spark/settings.py ``SHORT_BATCH_JVM_OPTIONS``).
    :param launched: the settings the running JVM was given (spark-submit's ``--conf``), which ``conf`` overrides.
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
        **STATIC_SQL_SETTINGS,
    }
    if settings["spark.master"].startswith("local"):
        # Everything runs in this JVM: keep the driver's ports on loopback instead of the address
        # the host name resolves to.
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    # Spark's RPC and block transfers answer only holders of the secret Spark makes (spark/settings.py).
    settings.update(network_security(settings["spark.master"], conf))
    settings.update(conf or {})
    # A local master's web UI: off unless asked for; one asked for cannot kill (spark/settings.py ``ui_settings``).
    settings.update(ui_settings(settings["spark.master"], conf, launched))
    # Spark's optimizer may not prove what PostgreSQL's planner does not (spark/settings.py); the user's own
    # exclusions are kept beside ours.
    theirs = [r.strip() for r in settings.get(EXCLUDED_RULES_SETTING, "").split(",") if r.strip()]
    settings[EXCLUDED_RULES_SETTING] = ",".join(dict.fromkeys([*EXCLUDED_OPTIMIZER_RULES, *theirs]))
    # The JVMs' own zone (java.time conversions read it) and the JIT for long
    # generated methods, added to the caller's Java options (spark/settings.py SPARK_JVM_OPTIONS).
    settings = with_jvm_options(settings, short_batch=short_batch)
    return settings


def build_session(
    app_name: str, master: str | None = None, conf: Mapping[str, str] | None = None, *, short_batch: bool = False
) -> SparkSession:
    """Build (or get) the SparkSession for a job: UTC, with the settings of :func:`session_conf`.

    Static settings (master, JVM options) only take effect when no session is running
    in this process yet; :meth:`SparkSession.builder.getOrCreate` keeps the existing one.

    :param app_name: Spark application name.
    :param master: Spark master URL; default ``local[*]``.
    :param conf: extra Spark settings, applied last (``{"spark.ui.enabled": "false"}`` in tests).
    :param short_batch: the session runs one short apply batch and stops; its JVM compiles for a short life.
    """
    builder = SparkSession.builder.appName(app_name)
    settings = session_conf(master, conf, short_batch=short_batch, launched=_launched_settings())
    if settings.get("spark.ui.enabled") == "true" and is_local(settings["spark.master"]):
        _require_loopback_ui()
    scratch = None
    if SparkContext._active_spark_context is None and wants_local_dir(settings):
        # Shuffle and spill files (replicated rows) in a directory of this user's alone, whatever the umask.
        scratch = private_local_dir()
        if SparkContext._gateway is not None:  # the JVM runs already (spark-submit started it): a setting
            settings["spark.local.dir"], scratch = scratch, None
    if settings["spark.master"].startswith("local"):
        # The Python workers of a local master run here: give them this interpreter and its packages
        # (psycopg for the copy's writers), not whichever `python3` comes first on PATH. PySpark reads
        # the variable when the context starts; an explicit setting wins.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in settings.items():
        builder = builder.config(key, value)
    loopback = is_local(settings["spark.master"]) and SparkContext._gateway is None  # a JVM started here, now
    with _scratch_environment(scratch), _environment(UI_ADDRESS_ENV, LOOPBACK if loopback else None):
        session = builder.getOrCreate()
    mark_session()  # the operator keeps the class archive this JVM writes when it exits (spark/class_archive.py)
    watch_executors(session.sparkContext, settings["spark.master"])  # a job the cluster gives no core says so
    logger.info("Spark session %r on %s (Spark %s)", app_name, session.sparkContext.master, session.version)
    return session


def _launched_settings() -> dict[str, str]:
    """The settings of the JVM spark-submit started for this job (its ``--conf``, the system properties a new
    SparkConf reads), when it did; else none (a JVM started by pyspark takes the builder's settings alone)."""
    if SparkContext._active_spark_context is not None or not (SparkContext._gateway or os.environ.get("PYSPARK_GATEWAY_PORT")):
        return {}
    from pyspark import SparkConf

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM (none is started)
    return dict(SparkConf().getAll())


def _require_loopback_ui() -> None:
    """Refuse a UI asked for in a JVM that was started without ``SPARK_LOCAL_IP`` on loopback (a user's own
    spark-submit): Spark would open it on every address of the host (spark/settings.py ``UI_ADDRESS_ENV``)."""
    if SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return  # the JVM is started below, with SPARK_LOCAL_IP=127.0.0.1
    SparkContext._ensure_initialized()
    jvm = cast(Any, SparkContext._jvm)
    address = jvm.java.lang.System.getenv(UI_ADDRESS_ENV) if jvm is not None else None
    if address not in (LOOPBACK, "localhost", "::1"):
        raise SpecError(f"spark_conf asks for Spark's web UI (spark.ui.enabled: true), but this job's JVM was started "
                        f"with {UI_ADDRESS_ENV}={address!r}, so the UI would listen on every address of the host",
                        hint=f"start spark-submit with {UI_ADDRESS_ENV}={LOOPBACK} in its environment (the operators "
                        "do), or leave spark.ui.enabled out; reach the UI from elsewhere through an SSH tunnel")


@contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``name=value`` in this process's environment during the block (the JVM pyspark starts copies it), then put
    back as it was; nothing when ``value`` is None."""
    if value is None:
        yield
        return
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextmanager
def _scratch_environment(scratch: str | None) -> Iterator[None]:
    """``SPARK_LOCAL_DIRS=scratch`` in the environment of the JVM started in the block (pyspark's gateway copies
    this process's): Spark takes its own variable silently, where ``spark.local.dir`` makes it warn in every
    job's log that a cluster manager would override it. This process's environment is put back after."""
    if scratch is None:
        yield
        return
    os.environ["SPARK_LOCAL_DIRS"] = scratch
    try:
        yield
    finally:
        os.environ.pop("SPARK_LOCAL_DIRS", None)


def remote_conf(conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings a Spark Connect session of a job gets: :func:`session_conf`'s SQL settings, caller's last.

    The master, the driver's addresses, the log level, the JVM options and the static SQL settings
    (spark/settings.py ``STATIC_SQL_SETTINGS``, the local server's own) belong to the server's JVM
    and cannot be set by a client (Spark refuses them: ``CANNOT_MODIFY_CONFIG``).
    """
    settings = {k: v for k, v in session_conf().items() if k.startswith("spark.sql.") and k not in STATIC_SQL_SETTINGS}
    settings.update(conf or {})
    return settings


def reused_session_id(token: str | None, subscription: str, job: str, conf: Mapping[str, str],
                      now: float | None = None) -> str | None:
    """The Spark Connect session id of ``job``'s runs for ``subscription`` with the session settings ``conf``
    in this period of :data:`SESSION_REUSE_SECONDS`, on the server whose token is ``token``: the same in every
    process, another in the next period, and another when the settings change (a session keeps what was set
    on it). None without a token: each run then takes a new random session and releases it.

    A new session costs its first queries: the server starts Python workers for each session (a
    copy's writers, a large batch's), and a session's plans compile anew (docs/apply.md, "Spark Connect").
    Within a period every run attaches to the same one and is never idle for longer than the period, so the
    server never expires it under a run; the next period's id is new, never one the server closed.

    The id is an HMAC of those under the token: whoever could attach to the session (read its temporary
    views, its settings) must hold the token, which lets them run code on the server anyway. An id made
    from names alone could be computed by anyone who knows the subscription's name.
    """
    if not token:
        return None
    period = int((time.time() if now is None else now) // SESSION_REUSE_SECONDS)
    settings = "\0".join(f"{k}={v}" for k, v in sorted(conf.items()))
    digest = hmac.new(token.encode(), f"rowfilter-session\0{subscription}\0{job}\0{period}\0{settings}".encode(),
                      hashlib.sha256).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))  # the server takes only UUIDs as session ids


def connect_session(remote: str, conf: Mapping[str, str] | None = None, session_id: str | None = None, *,
                    token: str | None = None, token_from: str = "") -> SparkSession:
    """A Spark Connect session on the server at ``remote`` (``sc://host:port``), with :func:`remote_conf`.

    :param session_id: attach to this server-side session (created on first use) and leave it to the
        server when done, for the next run; unless ``remote`` names one itself (``;session_id=``). A
        session the server has closed is replaced by a new one.
    :param token: the server's token (spark/connect_server.py ``token_of``), sent with every request; a
        loopback address is then named ``localhost``, which pyspark's client reaches without TLS.
    :param token_from: where ``token`` was found, or where it was looked for (spark/connect_server.py
        ``find_token``), for the error when the server refuses it.
    :raises SparkAuthenticationError: the server refused the token, or asks for one and none was found
        (not transient: a retry meets the same refusal).
    :raises SparkUnavailableError: nothing listens at ``remote`` (transient: a later run may find it up).
    :raises SpecError: the server refuses one of the settings (named, with the fix).
    """
    if SparkContext._active_spark_context is not None:
        # pyspark runs one mode per process: a Connect session marks the whole process as Connect
        # (SPARK_CONNECT_MODE_ENABLED), after which the classic session's functions build Connect columns.
        raise SpecError(f"this process already runs a classic Spark session; it cannot attach to spark_remote {remote!r} "
                        "too (pyspark runs one mode per process)",
                        hint="run the job in a process of its own (`python -m airflow_provider_rowfilter.jobs.<job>`, "
                        "as the operators do), or leave spark_remote out of the spec")
    require_server(remote)
    session = None
    try:
        session = _attach(_with_token(remote, token), session_id)
        _ = session.version  # the first request (none yet without a session id): a refused token is refused here
    except Exception as e:
        if not _unauthenticated(e):
            raise
        if session is not None:
            with suppress(Exception):
                session.stop()
        raise _token_refused(remote, e, token, token_from) from None
    settings = remote_conf(conf)
    for key in SMALL_BATCH_SQL_SETTINGS.keys() - settings.keys():
        # A reused session keeps what its last run set: a run killed during a small batch's action
        # (spark/apply_frames.py) would leave these for the next, a drain of large batches perhaps.
        session.conf.unset(key)
    for key, value in settings.items():
        try:
            session.conf.set(key, value)
        except Exception as e:  # AnalysisException CANNOT_MODIFY_CONFIG / CANNOT_MODIFY_STATIC_CONFIG, …
            session.stop()
            first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise SpecError(f"spark_conf {key}={value!r} cannot be set by a Spark Connect client of {remote!r}: "
                            f"{first.strip()[:300]}",
                            hint="set it on the server instead (`rowfilter spark-server start --conf KEY=VALUE`, or the "
                            "cluster's Spark Connect configuration) and remove it from spark_conf") from None
    logger.info("Spark Connect session on %s (Spark %s)", remote.partition(";")[0], session.version)
    return session


def _unauthenticated(error: BaseException) -> bool:
    """``error`` is the server's refusal of the client's token (gRPC's ``UNAUTHENTICATED``)."""
    code = getattr(error, "getGrpcStatusCode", lambda: None)()
    return getattr(code, "name", None) == "UNAUTHENTICATED" or "UNAUTHENTICATED" in str(error)


def _token_refused(remote: str, error: BaseException, token: str | None, token_from: str) -> SparkAuthenticationError:
    """The error of a job whose token the server at ``remote`` refused: where the job looked, and the fix."""
    said = next((line.split("=", 1)[1].strip().strip('"') for line in str(error).splitlines()
                 if line.strip().startswith("details")), "UNAUTHENTICATED")
    address = remote.partition(";")[0].rstrip("/")
    if token:
        what = f"refused this job's token, from {token_from or 'the caller'}: {said}"
        fix = ("the local server makes a new token at every start: give the job the current one (the server's "
               "token file, `rowfilter spark-server status` names it), or, in Airflow, the spark_connect "
               "connection's Token")
    else:
        what = f"asks for a token and this job found none ({said}): {token_from or 'none was given'}"
        fix = ("for the local server, set ROWFILTER_SPARK_SERVER_DIR to the --state-dir it was started with "
               "(its token is that directory's file `token`), or give the token in SPARK_CONNECT_AUTHENTICATE_TOKEN; "
               "in Airflow, set the spark_connect connection's Token")
    return SparkAuthenticationError(f"the Spark Connect server at spark_remote {address!r} {what}", hint=fix)


def _with_token(remote: str, token: str | None) -> str:
    """``remote`` with ``;token=`` (kept in this process: the URL is never logged), its loopback host as
    ``localhost``: with a token pyspark's client insists on TLS for any other name, and the local server
    (127.0.0.1 only) has none; ``localhost`` gets gRPC's local credentials, for loopback connections only."""
    if not token:
        return remote
    base, params = remote_params(remote)
    host, port = remote_address(remote)
    use_ssl = any(key == "use_ssl" and value.lower() == "true" for key, value in params)
    if host in _LOOPBACK and not use_ssl:
        base = f"sc://localhost:{port}/"
    return with_remote_params(base, [*((k, v) for k, v in params if k != "token"), ("token", token)])


def _attach(remote: str, session_id: str | None) -> SparkSession:
    """The client session: on ``session_id`` (kept on the server when this one stops), else a new one."""
    base, params = remote_params(remote)
    named_by_user = any(key == "session_id" for key, _ in params)
    if session_id is None or named_by_user:
        session = SparkSession.builder.remote(remote).create()
        cast(Any, session).release_session_on_close = not named_by_user  # one named in spark_remote is the user's
        return session
    session = SparkSession.builder.remote(with_remote_params(base, [*params, ("session_id", session_id)])).create()
    cast(Any, session).release_session_on_close = False  # a Connect session's attribute
    try:
        _ = session.version  # the first request: the server refuses here an id it has closed
    except Exception as e:
        if "SESSION_CLOSED" not in str(e):
            raise
        logger.info("Spark Connect session %s was closed by the server; this run takes a new one", session_id)
        session.stop()
        session = SparkSession.builder.remote(remote).create()
    return session


@contextmanager
def job_session(spec: SubscriptionSpec, job: str, spark: SparkSession | None = None, *,
                short_batch: bool = False) -> Iterator[SparkSession]:
    """The session a job runs in: ``spark``, else the active one (either left running; not with
    ``spark_remote``), else one built
    from the spec's ``spark_master`` and ``spark_conf``, named ``rowfilter-<job>-<subscription>``,
    and stopped when the job is done; with the spec's ``spark_remote``, a Spark Connect session on that
    server (:func:`connect_session`), closed when the job is done (the server keeps running).

    :param short_batch: a session of our own runs one short apply batch (see :func:`build_session`).
    :raises SpecError: Spark cannot start with the spec's settings (raised before the job changed anything).
    """
    # A spec naming a Connect server never runs on this process's classic session (connect_session refuses the mix).
    existing = spark or (None if spec.spark_remote else SparkSession.getActiveSession())
    if existing is not None:
        yield existing
        return
    if spec.spark_remote:
        from airflow_provider_rowfilter.spark.connect_server import find_token

        token, token_from = find_token(spec.spark_remote)
        session = connect_session(spec.spark_remote, spec.spark_conf,
                                  reused_session_id(token, spec.subscription, job, remote_conf(spec.spark_conf)),
                                  token=token, token_from=token_from)
        try:
            yield session
        finally:
            session.stop()
        return
    try:
        session = build_session(f"rowfilter-{job}-{spec.subscription}", spec.spark_master, spec.spark_conf,
                                short_batch=short_batch)
    except RowFilterError:
        raise
    except Exception as e:  # Spark's own error (a bad master URL or setting)
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise SpecError(f"cannot start Spark with spark_master {spec.spark_master!r}: "
                        f"{type(e).__name__}: {first.strip()[:500]}",
                        hint="check spark_master and spark_conf in the spec") from e
    try:
        yield session
    finally:
        session.stop()
