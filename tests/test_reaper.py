"""A server a test run started dies with the run when the run is killed (tests/reaper.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_killed_run_takes_its_server_group_with_it() -> None:
    # A stand-in for a run: it starts a "server" leading a group of its own (as the Spark Connect server does),
    # with a child in that group (its JVM), watches it, prints both pids and waits to be killed.
    run = subprocess.Popen([sys.executable, "-c", """
import subprocess, sys, time
from tests.reaper import reaped
server = subprocess.Popen(["/bin/sh", "-c", "sleep 300 & wait"], start_new_session=True)
with reaped(server.pid):
    time.sleep(0.5)
    child = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()[0]
    print(server.pid, child, flush=True)
    time.sleep(300)
"""], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert run.stdout is not None
    server, child = (int(p) for p in run.stdout.readline().split())
    assert _alive(server) and _alive(child)
    run.send_signal(signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 10
    while (_alive(server) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server) and not _alive(child), "the killed run left its server running"


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
