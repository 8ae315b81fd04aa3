"""Connections to the publisher and the subscriber: libpq strings checked for secrets, passwords from the environment;
and which errors a later run may not meet."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import psycopg

from airflow_provider_rowfilter.core.conninfo import PASSWORD_ENV, check_no_password, parse, scrub
from airflow_provider_rowfilter.core.errors import SpecError, UnreachableError
from airflow_provider_rowfilter.core.spec import SubscriptionSpec

__all__ = ["PASSWORD_ENV", "connect", "conninfo_params", "in_task", "is_transient", "password"]

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
        extra: dict[str, str] = {"password": secret} if secret else {}
        if handed and handed[1] and not any(p.key == "connect_timeout" for p in parse(url)):
            extra["connect_timeout"] = str(handed[1])
        return psycopg.connect(url, autocommit=True, application_name=f"rowfilter:{spec.subscription}",
                               **extra, **params)
    except psycopg.OperationalError as e:
        # libpq's and the server's texts quote values of the string: only host, port, user and dbname
        # may show (core/conninfo.py, scrub); the traceback's chain would repeat the raw text
        host = next((p.value for p in parse(url) if p.key == "host"), "?")
        text = scrub(str(e).strip(), url)
        conn_id = getattr(spec, f"{role}_conn_id", None)  # the spec came from Airflow: name its connection too
        via = f" (Airflow connection {conn_id!r})" if conn_id else ""
        raise UnreachableError(f"cannot connect to the {role} of subscription {spec.subscription!r} at host {host}{via}",
                               detail=text.splitlines()[0] if text else None) from None
    except psycopg.ProgrammingError as e:  # libpq refused a keyword or value
        raise SpecError(f"{what} is not a valid connection string: {scrub(str(e).strip(), url)}") from None


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
