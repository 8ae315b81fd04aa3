"""Whether a process still runs: the one test of it for the local servers the tools start and stop
(the Spark Connect server, spark/connect_server.py; the local PostgreSQL, tooling/embedded.py)."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """``pid`` runs: it exists (another user's too) and has not exited. A child of ours that exited is
    reaped here; a zombie (exited, its parent has not reaped it yet) is not alive."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # no /proc (macOS), or it ended meanwhile: the signal said it was there
        return True
