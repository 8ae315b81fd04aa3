"""What a job prints under spark-submit (or as a Spark Connect client), read back for its operator.

``SparkSubmitHook`` logs every line of spark-submit's output at INFO through its logger. The package's
hook (hooks/spark_submit_job.py) makes that logger a :class:`JobOutput`, which logs each line at the
level it was written with (the jobs' own ``LEVEL logger: message`` lines, Spark's ``yy/MM/dd HH:mm:ss
LEVEL`` lines, Python's warnings), keeps the job's ``ERROR:`` block (message, DETAIL, HINT:
jobs/exit_status.py), its exit status and its JSON result line, and lets :func:`job_failure` turn a
failed job into the right Airflow exception.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any
from urllib.parse import unquote

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_rowfilter.core.spec.spark_remote import remote_params, with_remote_params

#: The exit status of a job whose error a later run may not meet (jobs/exit_status.py EXIT_TRANSIENT).
EXIT_TRANSIENT = getattr(os, "EX_TEMPFAIL", 75)
_OURS = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")  # the jobs' logging.basicConfig format
_SPARK = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")  # log4j2's default
_PY_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")
_LEVELS = {"TRACE": "debug", "DEBUG": "debug", "INFO": "info", "WARN": "warning", "WARNING": "warning",
           "ERROR": "error", "FATAL": "error", "CRITICAL": "error"}
_ERROR = "ERROR: "
#: The last line of a failed job's output (jobs/exit_status.py EXIT_STATUS_LINE).
_EXIT_STATUS = re.compile(r"^rowfilter job exit status: (\d+)$")


class JobOutput:
    """A logger for ``SparkSubmitHook`` that sorts the job's output lines by level (see the module)."""

    def __init__(self, log: Any) -> None:
        self._log = log
        self._in_error = False
        self.lines = 0
        #: The job's last ``ERROR:`` block, without the prefix (PostgreSQL's text, DETAIL, HINT).
        self.error: list[str] = []
        #: The job's JSON result line, parsed.
        self.result: dict[str, Any] | None = None
        #: The exit status a failed job printed last (None: it printed none, e.g. it crashed).
        self.exit_status: int | None = None

    def info(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:  # the hook's own messages ("Identified spark driver id: %s")
            self._log.info(msg, *args, **kwargs)
        else:
            self.line(str(msg))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def line(self, line: str) -> None:
        """One line of spark-submit's output: logged at its level, the error and the result kept."""
        self.lines += 1
        match = _OURS.match(line) or _SPARK.match(line)
        status = _EXIT_STATUS.match(line)
        if status:
            self.exit_status, self._in_error, level = int(status.group(1)), False, "info"
        elif line.startswith(_ERROR):
            self.error, self._in_error, level = [line[len(_ERROR):]], True, "error"
        elif match:
            self._in_error, level = False, _LEVELS[match.group(1)]
        elif _PY_WARNING.match(line):
            self._in_error, level = False, "warning"
        elif line.startswith("{") and self._result(line):
            self._in_error, level = False, "info"
        elif self._in_error:  # the error's DETAIL, HINT and further lines
            self.error.append(line)
            level = "error"
        else:  # the JVM's and Python's own lines ("Setting Spark log level to ...", a warning's source line)
            level = "info"
        getattr(self._log, level)("%s", line)

    def _result(self, line: str) -> bool:
        try:
            value = json.loads(line)
        except ValueError:
            return False
        if isinstance(value, dict):
            self.result = value
        return isinstance(value, dict)

    @property
    def error_text(self) -> str | None:
        return "\n".join(self.error).strip() or None


def job_failure(output: JobOutput | None, returncode: int | None, error: Exception) -> Exception:
    """The exception a failed spark-submit ends the task with.

    The job's own error is the message: :class:`AirflowFailException` (no retry) when the job said it
    is one a new run would meet again (exit 1 with an ``ERROR:`` block), :class:`AirflowException`
    (Airflow retries) when it said it may pass (exit 75). Anything else (spark-submit or the JVM
    failing, a crash without our error) keeps ``SparkSubmitHook``'s exception, and its retries.
    """
    text = output.error_text if output is not None else None
    if text is None:
        return error
    if returncode == EXIT_TRANSIENT:
        return AirflowException(text)
    if returncode == 1:
        return AirflowFailException(text)
    return error


def connect_url(url: str) -> tuple[str, str | None]:
    """``SparkConnectHook.get_connection_url()`` split into the URL without its ``token`` and the token.

    The URL goes into the spec (on the job's command line); the token only into the job's environment
    (``SPARK_CONNECT_AUTHENTICATE_TOKEN``, which pyspark's client reads).
    """
    base, params = remote_params(url)
    token = next((unquote(value) for key, value in params if key == "token"), None)
    return with_remote_params(base, [(key, value) for key, value in params if key != "token"]), token
