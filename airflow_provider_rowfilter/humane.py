"""Sizes, durations, ages and per-table counts as a person reads them (the CLI and the task logs).

Never ``None``: a value that is unknown is said to be (the caller picks the words).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass

#: The order the counts of one table are said in (``rowfilter.batch_history.counts``); others follow, sorted.
COUNT_ORDER = ("insert", "update", "delete", "truncate", "skipped", "filtered", "unpublished", "update_to_insert",
               "update_to_delete", "missing_update", "missing_delete")


#: The logger of progress lines (long copies, draining runs): shown by ``rowfilter`` without ``-v``.
PROGRESS_LOGGER = "airflow_provider_rowfilter.progress"

#: The attribute of a progress line's log record that holds its :class:`ProgressReport`.
PROGRESS_ATTR = "rowfilter_progress"


@dataclass(frozen=True)
class ProgressReport:
    """How far a long copy or drain is, made once by the job: the ``line`` a log gets (Airflow's task log,
    ``rowfilter`` piped), and the numbers a terminal's progress bar draws (console/progress.py).

    ``kind`` (``copy``, ``drain``) and ``label`` (the table, the subscription) name one bar, its :attr:`key`;
    ``done`` of ``total`` (None: unknown) in the job's own unit (``done`` None: as the last report said);
    ``detail`` what the bar says beside it (rate, what is left, the time left). ``final``: the last report,
    logged at DEBUG (a log's lines stay as they were; a bar shows its end, or ``failed``).
    """

    kind: str
    label: str
    done: float | None
    total: float | None
    detail: str
    line: str
    final: bool = False

    @property
    def key(self) -> str:
        """The bar this report moves: ``copy public.t``, ``drain s1``."""
        return f"{self.kind} {self.label}"

    @classmethod
    def failed(cls, kind: str, label: str) -> ProgressReport:
        """The last report of a job that failed: its bar keeps its last reading and says ``failed``."""
        return cls(kind, label, None, None, "failed", f"{label}: failed", final=True)


def report_progress(report: ProgressReport) -> None:
    """Log ``report`` on :data:`PROGRESS_LOGGER`: its line as the message, itself as :data:`PROGRESS_ATTR`."""
    logging.getLogger(PROGRESS_LOGGER).log(logging.DEBUG if report.final else logging.INFO, "%s", report.line,
                                           extra={PROGRESS_ATTR: report})


def size(n: int | float) -> str:
    """``1,023 B``, ``64.0 kB``, ``776.7 MB``: units of 1024 with PostgreSQL's names (as pg_size_pretty)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{int(n):,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover - the loop returns at GB


def duration(seconds: float) -> str:
    """``850 ms``, ``11.9 s``, ``3 min 12 s``, ``2 h 5 min``, ``3 d 4 h``: two units at most."""
    seconds = max(float(seconds), 0.0)
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    for big, big_name, small, small_name in ((86400, "d", 3600, "h"), (3600, "h", 60, "min"), (60, "min", 1, "s")):
        if whole >= big:
            major, rest = divmod(whole, big)
            minor = rest // small
            return f"{major} {big_name}" + (f" {minor} {small_name}" if minor else "")
    return f"{whole} s"  # pragma: no cover - seconds >= 60 took a branch


def ago(then: dt.datetime, now: dt.datetime) -> str:
    """``20 min ago``; ``just now`` under a second (a clock a little ahead is not "in the future")."""
    seconds = (now - then).total_seconds()
    return "just now" if seconds < 1 else f"{duration(seconds)} ago"


def counts_text(counts: Mapping[str, int]) -> str:
    """``insert 3, update 1, skipped 2``: every non-zero count of one table in one batch; ``no changes`` for none."""
    keys = [k for k in COUNT_ORDER if k in counts] + sorted(k for k in counts if k not in COUNT_ORDER)
    said = [f"{k} {counts[k]:,}" for k in keys if counts[k]]
    return ", ".join(said) or "no changes"


def batch_lag(lag_bytes: int | None, lag_seconds: float | None) -> str:
    """How far behind the publisher a batch was when it was captured (not now): ``lag then: 1.2 MB, 11.9 s``."""
    said = ([size(lag_bytes)] if lag_bytes is not None else []) + \
        ([duration(lag_seconds)] if lag_seconds is not None else [])
    return "lag when captured: " + (", ".join(said) if said else "not measured (no transaction captured)")
