"""Connections to the publisher and the subscriber: libpq strings checked for secrets, passwords from the environment,
every session's search_path pinned; and which errors a later run may not meet.

:func:`open_session` (and :func:`open_async_session`) is the one place a connection of ours is made: the jobs,
the CLI, the operators, hooks, sensor and trigger, the Replication page, and the Spark tasks' readers and
writers all come through it (tests/test_connection.py refuses a ``psycopg.connect`` anywhere else in the
package but the test tooling). Each session runs PostgreSQL's own ``ALWAYS_SECURE_SEARCH_PATH_SQL``
(src/include/common/connect.h) before anything else, as the walreceiver and tablesync sessions of a native
subscription do (src/backend/replication/libpqwalreceiver/libpqwalreceiver.c, ``libpqrcv_connect``) and as
its apply worker sets for itself: an empty ``search_path``. Unqualified names then resolve in ``pg_catalog``
(and, for tables and types, in the session's own ``pg_temp``) only, so a role with CREATE on a database
cannot shadow a built-in operator or function with one in a schema it makes (say the job role's ``$user``
schema), nor a table. The pin is a ``set_config`` in the session, not a ``-c search_path=`` of libpq's
``options``: a connection string's own ``options`` (``-c search_path=evil,public``), ``PGOPTIONS`` or an
``ALTER ROLE … SET search_path`` set only the session's starting value, which the pin then replaces; such a
request is logged once as a WARNING (:func:`_warn_search_path`), as it has no effect.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg

from airflow_provider_rowfilter.core.errors import SpecError, UnreachableError
from airflow_provider_rowfilter.core.spec.conninfo import PASSWORD_ENV, check_no_password, parse, scrub
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

__all__ = ["PASSWORD_ENV", "SECURE_SEARCH_PATH_SQL", "connect", "conninfo_params", "in_task", "is_transient",
           "open_async_session", "open_session", "password"]

log = logging.getLogger(__name__)

#: What every session of ours runs first: PostgreSQL's ALWAYS_SECURE_SEARCH_PATH_SQL (src/include/common/connect.h),
#: the statement libpqwalreceiver.c ``libpqrcv_connect`` sends on each logical replication connection.
SECURE_SEARCH_PATH_SQL = "SELECT pg_catalog.set_config('search_path', '', false)"
#: The ``options`` strings already warned about in this process (:func:`_warn_search_path`).
_WARNED: set[str] = set()

#: What a job's code run inside another process was handed (:func:`in_task`): passwords by role, and a
#: connect timeout for URLs that set none.
_IN_TASK: ContextVar[tuple[Mapping[str, str], int | None] | None] = ContextVar("rowfilter_in_task", default=None)


@contextmanager
def in_task(passwords: Mapping[str, str], connect_timeout: int | None = None) -> Iterator[None]:
    """Within the block, connections use these passwords (``{"publisher": …}``) before the environment's,
    and give up connecting after ``connect_timeout`` seconds where the URL sets no ``connect_timeout``.

    For a job's code run inside another process (an operator's task), which must neither put the
    passwords in its own environment, where every child process would inherit them, nor anywhere else.
    """
    token = _IN_TASK.set((dict(passwords), connect_timeout))
    try:
        yield
    finally:
        _IN_TASK.reset(token)


def password(role: str) -> str | None:
    """The password of ``role`` (``publisher``/``subscriber``): handed in (:func:`in_task`), else
    ``ROWFILTER_<ROLE>_PASSWORD``; None leaves it to libpq (``PGPASSWORD``, ``~/.pgpass``). A ``standby``
    (the spec's ``standbys``) is reached with the publisher's: a physical standby has its primary's roles."""
    role = "publisher" if role == "standby" else role
    handed = _IN_TASK.get()
    return (handed[0].get(role) if handed else None) or os.environ.get(PASSWORD_ENV[role]) or None


def connect(url: str | None, role: str, spec: SubscriptionSpec, **params: str) -> psycopg.Connection:
    """Open a connection to the publisher or subscriber (``role``).

    The password never travels in the spec: it comes from :func:`in_task` (a job run in an operator's
    task), ``ROWFILTER_PUBLISHER_PASSWORD`` / ``ROWFILTER_SUBSCRIBER_PASSWORD`` (what the Airflow
    operators set from their connections for a job process) or from libpq's own ``PGPASSWORD`` /
    ``~/.pgpass``. ``params`` are further libpq parameters, e.g.
    ``replication="database"``.
    """
    if not url:
        raise SpecError(f"subscription {spec.subscription!r} has no {role} URL",
                        hint=f"set {role}: postgresql://user@host:port/db in the spec "
                        f"(or {role}_conn_id when running from Airflow)")
    what = f"the {role} of subscription {spec.subscription!r}"
    check_no_password(url, what, role)
    try:
        handed, secret = _IN_TASK.get(), password(role)
        extra: dict[str, Any] = {"password": secret} if secret else {}  # libpq parameters, all text
        if handed and handed[1] and not any(p.key == "connect_timeout" for p in parse(url)):
            extra["connect_timeout"] = str(handed[1])
        extra.update(params)
        return open_session(url, application_name=f"rowfilter:{spec.subscription}", **extra)
    except psycopg.OperationalError as e:
        # libpq's and the server's texts quote values of the string: only host, port, user and dbname
        # may show (core/spec/conninfo.py, scrub); the traceback's chain would repeat the raw text
        host = next((p.value for p in parse(url) if p.key == "host"), "?")
        text = scrub(str(e).strip(), url)
        conn_id = getattr(spec, f"{role}_conn_id", None)  # the spec came from Airflow: name its connection too
        via = f" (Airflow connection {conn_id!r})" if conn_id else ""
        raise UnreachableError(f"cannot connect to the {role} of subscription {spec.subscription!r} at host {host}{via}",
                               detail=text.splitlines()[0] if text else None) from None
    except psycopg.ProgrammingError as e:  # libpq refused a keyword or value
        raise SpecError(f"{what} is not a valid connection string: {scrub(str(e).strip(), url)}") from None


def open_session(conninfo: str = "", *, autocommit: bool = True, **params: Any) -> psycopg.Connection:
    """A session to a publisher or subscriber with its ``search_path`` pinned empty (the module's docstring).

    ``conninfo`` and ``params`` are what ``psycopg.connect`` takes (a libpq string, and keyword parameters such
    as ``password``, ``replication="database"``, or a whole parameter dictionary: ``open_session(**conninfo)``).
    The pin runs in autocommit, so that it holds for the whole session (a ``set_config`` inside a transaction
    that rolls back would be undone); the connection is then left in ``autocommit`` as asked, idle.

    :raises psycopg.Error: as ``psycopg.connect`` does, or when the pin fails (the connection is closed then).
    """
    conn = psycopg.connect(conninfo, autocommit=True, **params)
    try:
        conn.execute(SECURE_SEARCH_PATH_SQL)
        _warn_search_path(conn.info.options)
        conn.autocommit = autocommit
    except BaseException:
        conn.close()
        raise
    return conn


async def open_async_session(conninfo: str = "", *, autocommit: bool = True,
                             **params: Any) -> psycopg.AsyncConnection:
    """:func:`open_session` for async code (the trigger): the same pin, on an ``AsyncConnection``."""
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **params)
    try:
        await conn.execute(SECURE_SEARCH_PATH_SQL)
        _warn_search_path(conn.info.options)
        await conn.set_autocommit(autocommit)
    except BaseException:
        await conn.close()
        raise
    return conn


def _warn_search_path(options: str | None) -> None:
    """Say once per process that a connection's ``options`` (its string's, or ``PGOPTIONS``) ask for a search_path
    the pin replaces. PostgreSQL's CREATE SUBSCRIPTION accepts such a conninfo and pins all the same, silently;
    here the request is named, since whoever wrote it expects it to take effect. The options carry no secret
    (core/spec/conninfo.py refuses one in any value), but only the setting's name is logged."""
    if options and "search_path" in options.lower() and options not in _WARNED:
        _WARNED.add(options)
        log.warning("a connection's options set search_path: ignored. Every session runs with an empty "
                    "search_path, as PostgreSQL's replication workers do (names a publications file leaves "
                    "unqualified are looked up in public)")


def conninfo_params(url: str, what: str, role: str | None = None) -> dict[str, str]:
    """The libpq parameters of ``url`` as libpq reads them; refused (never quoted) when it holds a secret.

    libpq's own parse errors quote the string; :func:`check_no_password` runs first, so by then the
    string holds no secret and the message may show it.
    """
    check_no_password(url, what, role)
    try:
        return {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(url).items()}
    except (psycopg.ProgrammingError, UnicodeDecodeError) as e:
        raise SpecError(f"{what} is not a valid connection string: {scrub(str(e).strip(), url)}") from None


def primary_message(e: psycopg.Error) -> str:
    """PostgreSQL's primary message of ``e`` (without libpq's DETAIL and CONTEXT lines); else its text."""
    diag = getattr(e, "diag", None)
    return (diag.message_primary if diag is not None and diag.message_primary else str(e)).strip()


#: SQLSTATE classes of conditions that pass (PostgreSQL's src/backend/utils/errcodes.txt): 08 connection
#: exception, 40 transaction rollback (serialization failure, deadlock), 53 insufficient resources (too
#: many connections, out of memory, disk full), 57 operator intervention (shutdown, cancel, a server
#: starting up), 58 system error (I/O).
TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")
#: Single codes of class 55: 55006 object_in_use (a replication slot active for another process) and
#: 55P03 lock_not_available. The rest of class 55 (e.g. 55000, a table without replica identity) stays.
TRANSIENT_CODES = ("55006", "55P03")
#: What libpq says, without a SQLSTATE, when the server refuses a session for good (a retry cannot help).
_REFUSED_FOR_GOOD = ("password authentication failed", "authentication failed", "no pg_hba.conf entry",
                     "does not exist", "permission denied", "SSL is not enabled", "certificate")

#: Spark's conditions of an executor lost under a job (a worker or pod gone, a node reclaimed): the blocks it held
#: are gone with it, and a rerun recomputes them (spark/apply_frames.py keeps a cluster's judged batch where Spark
#: recomputes it; these cover what it cannot). Matched in the error's text: the Airflow side never imports pyspark.
SPARK_EXECUTOR_LOST = ("CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND", "ExecutorLostFailure", "FetchFailedException",
                       "MetadataFetchFailedException")


def is_transient(error: BaseException) -> bool:
    """Whether a later run may succeed without anybody changing anything (see the module's list).

    The error's causes are looked at too: our errors wrap the psycopg error they come from.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "transient", False):
            return True
        if type(current).__module__.startswith(("pyspark", "py4j")) and any(
                marker in str(current) for marker in SPARK_EXECUTOR_LOST):
            return True
        if isinstance(current, psycopg.Error):
            code = current.sqlstate
            if code:
                return code[:2] in TRANSIENT_CLASSES or code in TRANSIENT_CODES
            if isinstance(current, psycopg.OperationalError):  # libpq: refused, timed out, connection lost
                text = str(current)
                return not any(marker in text for marker in _REFUSED_FOR_GOOD)
            return False
        current = current.__cause__ or current.__context__
    return False


def one(cursor: psycopg.Cursor) -> tuple:
    """The row of a query that always returns one (an aggregate, a function call, ``EXISTS``): for the type checker,
    and a clear failure should it ever return none."""
    row = cursor.fetchone()
    if row is None:  # pragma: no cover - such a query always returns a row
        raise RuntimeError("a query that always returns a row returned none")
    return row
