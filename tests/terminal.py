"""The installed ``rowfilter`` command as a person meets it: in a tmux pane (a real terminal), or piped."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path


def exe() -> str:
    return shutil.which("rowfilter") or str(Path(sys.executable).parent / "rowfilter")


def tmux_screens(args: list[str], columns: int, *, timeout: float = 120, every: float = 0.5,
                 status: int = 0) -> list[str]:
    """The screens of a detached tmux session ``columns`` wide (a server of its own) running the command,
    read every ``every`` seconds while it runs (each different one once); the last is the screen once it is
    done, up to its exit status. Fails unless it exits with ``status``."""
    socket = f"rowfilter-test-{os.getpid()}-{columns}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    command = " ".join(shlex.quote(a) for a in [exe(), *args]) + "; echo __EXIT__$?; sleep 600"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TMUX")}
    subprocess.run([*tmux, "new-session", "-d", "-x", str(columns), "-y", "200", command], env=env, check=True)
    screens: list[str] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-S", "-", "-E", "-"], capture_output=True,
                                    text=True, check=True).stdout
            if not screens or screen != screens[-1]:
                screens.append(screen)
            if "__EXIT__" in screen:
                break
            time.sleep(every)
        else:
            raise AssertionError(f"not done in {timeout} s: {screens[-1]}")
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
    assert f"__EXIT__{status}\n" in screens[-1], screens[-1]
    screens[-1] = screens[-1].split("__EXIT__")[0].rstrip() + "\n"
    return screens


def in_tmux(args: list[str], columns: int) -> str:
    """The screen of a detached tmux session ``columns`` wide once the command is done."""
    return tmux_screens(args, columns)[-1]
