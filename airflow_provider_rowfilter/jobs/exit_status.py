"""How a job ends: its error on stderr, and an exit status that tells "run again" from "fix something".

- ``0``: every change is where it must be.
- ``1``: an error a new run would meet again (a missing publication, a replica identity, a conflict,
  a bad spec, a password refused): the Airflow operators fail the task at once, without retry.
- ``75`` (``EX_TEMPFAIL`` of sysexits.h): an error a later run may not meet (the server refused the
  connection or went away, a serialization failure or deadlock, another apply holding the lock:
  connection.py ``is_transient``): the operators let Airflow retry.

The job prints its error as ``ERROR: <message>`` followed by PostgreSQL's ``DETAIL:``/``HINT:``
lines and a last line with its exit status; the operators read that block back from the spark-submit
output and make it the task's exception (hooks/job_output.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import psycopg

from airflow_provider_rowfilter.connection import is_transient
from airflow_provider_rowfilter.core.errors import RowFilterError

EXIT_ERROR = 1
EXIT_TRANSIENT = getattr(os, "EX_TEMPFAIL", 75)
#: The line that ends a failed job's output: its exit status, for whoever reads the output and not the
#: process (the operators read spark-submit's output: hooks/job_output.py ``JobOutput.exit_status``).
EXIT_STATUS_LINE = "rowfilter job exit status: "


def fail(error: BaseException) -> int:
    """Print ``ERROR: …`` (with DETAIL and HINT) on stderr, then the exit status for ``error``, and return it."""
    status = EXIT_TRANSIENT if is_transient(error) else EXIT_ERROR
    print(f"ERROR: {str(error).strip() or type(error).__name__}", file=sys.stderr, flush=True)
    print(f"{EXIT_STATUS_LINE}{status}", file=sys.stderr, flush=True)
    return status


def run_job(body: Callable[[], int]) -> int:
    """Run a job's ``main`` body; our errors and PostgreSQL's end it with :func:`fail`.

    Anything else (a bug, the JVM gone) keeps its traceback and Python's exit status 1, which the
    operators cannot tell from a deterministic error without the ``ERROR:`` line, so they retry it.
    """
    try:
        return body()
    except (RowFilterError, psycopg.Error) as e:
        return fail(e)
