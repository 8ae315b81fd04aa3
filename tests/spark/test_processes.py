"""The one test of whether a process runs (spark/processes.py), on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from airflow_provider_rowfilter.spark.processes import alive


def test_a_running_process_is_alive_an_exited_one_is_not_even_before_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert alive(child.pid)
        assert alive(1)  # another user's process (init) runs too: PermissionError or not
    finally:
        child.kill()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child.pid}") and open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not alive(child.pid)  # a zombie: exited, not yet reaped (it is reaped here)
    assert not os.path.exists(f"/proc/{child.pid}")  # reaped: the pid is free
