"""Servers a test run starts die with the run, even when the run itself is killed (no orphans on the machine).

A fixture stops its server at teardown; a run killed before it (a timeout, ``kill``, Ctrl-C twice) would
leave the Spark Connect server's JVM or moto's server running with parent 1. :func:`reaped` starts a
watchdog that reads its stdin, which only this process holds: when the process dies, the pipe closes
and the watchdog terminates the server's process group (tooling/embedded.py watches the run's
PostgreSQL clusters the same way).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

_SCRIPT = 'cat >/dev/null; kill -TERM "-$1" 2>/dev/null || kill -TERM "$1" 2>/dev/null; exit 0'


@contextmanager
def reaped(pid: int) -> Iterator[None]:
    """While inside, the process ``pid`` (and its group, when it leads one) is terminated if this process dies."""
    watchdog = subprocess.Popen(["/bin/sh", "-c", _SCRIPT, "rowfilter-test-reaper", str(pid)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd="/", start_new_session=True)
    try:
        yield
    finally:  # the fixture stops its server itself: the watchdog goes first, never acting on a reused pid
        watchdog.kill()
        watchdog.wait()
        assert watchdog.stdin is not None
        watchdog.stdin.close()
