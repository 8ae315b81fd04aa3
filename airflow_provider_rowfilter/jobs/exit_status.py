"""How a job ends: its error on stderr, and an exit status that tells "run again" from "fix something".

- ``0``: every change is where it must be.
- ``1``: an error a new run would meet again (a missing publication, a replica identity, a conflict,
  a bad spec, a password refused): the Airflow operators fail the task at once, without retry.
- ``75`` (``EX_TEMPFAIL`` of sysexits.h): an error a later run may not meet (the server refused the
  connection or went away, a serialization failure or deadlock, another apply holding the lock): the
  operators let Airflow retry.

The job prints its error as ``ERROR: <message>`` followed by PostgreSQL's ``DETAIL:``/``HINT:``
lines; the operators read that block back from the spark-submit output and make it the task's
exception (operators/job_output.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import psycopg

from airflow_provider_rowfilter.core.errors import RowFilterError

EXIT_ERROR = 1
EXIT_TRANSIENT = getattr(os, "EX_TEMPFAIL", 75)
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


def fail(error: BaseException) -> int:
    """Print ``ERROR: …`` (with DETAIL and HINT) on stderr; the exit status for ``error``."""
    print(f"ERROR: {str(error).strip() or type(error).__name__}", file=sys.stderr, flush=True)
    return EXIT_TRANSIENT if is_transient(error) else EXIT_ERROR


def run_job(body: Callable[[], int]) -> int:
    """Run a job's ``main`` body; our errors and PostgreSQL's end it with :func:`fail`.

    Anything else (a bug, the JVM gone) keeps its traceback and Python's exit status 1, which the
    operators cannot tell from a deterministic error without the ``ERROR:`` line, so they retry it.
    """
    try:
        return body()
    except (RowFilterError, psycopg.Error) as e:
        return fail(e)
