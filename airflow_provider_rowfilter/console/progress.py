"""How the ``rowfilter`` command shows a long copy or drain: live bars on a terminal, the log's lines elsewhere.

The jobs report their progress once, as log records of ``PROGRESS_LOGGER`` carrying a
:class:`~airflow_provider_rowfilter.humane.ProgressReport` (subscriber/copy_progress.py, flows/apply/drain.py).
Where stderr is not a terminal (a pipe, a file, Airflow's task log) nothing here runs: the records are
printed as the lines they are. On a terminal, :func:`progress_bars` draws one Rich bar per report key
(rows copied of the estimate for a copy, WAL done of the run's target for a drain), with what the report
says beside it (rate, what is left, the time left), and leaves each bar on the screen as it ended.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn
from rich.text import Text

from airflow_provider_rowfilter.humane import PROGRESS_ATTR, PROGRESS_LOGGER, ProgressReport


def wants_bars(console: Console) -> bool:
    """Whether ``console`` (stderr's) writes to a terminal that can redraw a bar in place: a real one
    (FORCE_COLOR, which CI sets for colours in a log, does not make a pipe one), not ``TERM=dumb``, and
    not turned off by ``TTY_INTERACTIVE=0``."""
    try:
        real = console.file.isatty()
    except (AttributeError, ValueError):
        return False
    return real and console.is_interactive and not console.is_dumb_terminal


class BarHandler(logging.Handler):
    """A handler of ``PROGRESS_LOGGER`` drawing its reports as bars; any other record of it as its line."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(logging.DEBUG)
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}

    def emit(self, record: logging.LogRecord) -> None:
        report: ProgressReport | None = getattr(record, PROGRESS_ATTR, None)
        if report is None:
            if record.levelno >= logging.INFO:
                self.progress.console.print(record.getMessage(), markup=False, highlight=False, soft_wrap=True)
            return
        task = self.tasks.get(report.key)
        if task is None:
            if report.final:  # done before its first report: a short copy shows no bar
                return
            task = self.tasks[report.key] = self.progress.add_task(report.label, total=report.total,
                                                                   detail=report.detail)
        self.progress.update(task, completed=report.done, total=report.total, detail=report.detail)  # None: kept


def bar_display(console: Console) -> Progress:
    """The bars: a name, the bar, the share, what the report says. Names and reports are text, never Rich
    markup (a table named ``"t[/x]"`` is printed as it is)."""
    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), TaskProgressColumn(),
                    TextColumn("{task.fields[detail]}", markup=False), console=console, redirect_stderr=False)


@contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """While the block runs, draw the progress reports as bars on stderr's terminal (when ``enabled``:
    see :func:`wants_bars`). Not enabled: nothing changes.

    Whatever else is written to stderr meanwhile is printed above the bars, line by line: our log lines,
    and Spark's JVM, which writes to the process's file descriptor 2 and would otherwise write through
    the bars. So descriptor 2 becomes a pipe, read by a thread of its own, for the block; what arrives
    after it (a JVM started in it keeps the pipe) goes to the terminal as it is.
    """
    if not enabled:
        yield
        return
    terminal = os.dup(2)
    out = os.fdopen(terminal, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    progress = bar_display(Console(file=out, markup=False, highlight=False))
    showing = threading.Event()
    reading, writing = os.pipe()

    def forward() -> None:
        with os.fdopen(reading, "rb") as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace")
                if showing.is_set():
                    progress.console.print(Text(line.rstrip("\n")), soft_wrap=True)
                else:
                    out.write(line)

    logger = logging.getLogger(PROGRESS_LOGGER)
    bars = BarHandler(progress)
    saved = logger.level, logger.propagate
    sys.stderr.flush()
    os.dup2(writing, 2)
    os.close(writing)
    threading.Thread(target=forward, name="stderr-above-bars", daemon=True).start()
    showing.set()
    progress.start()
    logger.addHandler(bars)
    logger.setLevel(logging.DEBUG)  # the final reports too (at DEBUG, so that a log never shows them)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(bars)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        sys.stderr.flush()
        os.dup2(terminal, 2)
        time.sleep(0.1)  # the lines already in the pipe, above the bars
        showing.clear()
        progress.stop()
