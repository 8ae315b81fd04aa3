"""Another OS user on the same host: uid 65534 (``nobody``) running Python code, the attacker of issue 28's tests.

The tests run as root here; the attacker is a process of its own that drops to uid/gid 65534 with no
supplementary groups before it runs, with an environment of its own (none of the run's: no PGPASSFILE,
no token, no password). Its code prints what it got; the tests assert that it got nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

NOBODY = 65534
REPO = Path(__file__).resolve().parents[1]
#: Tests that need a second OS user: only root can become one.
as_root_only = pytest.mark.skipif(os.geteuid() != 0, reason="running code as another OS user (uid 65534) needs root")


def _drop() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def run_as_nobody(code: str, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (Python, dedented) as uid 65534 with this run's packages; its output, whatever its exit.

    This interpreter may live where uid 65534 cannot go (a pyenv under a 0700 /root): then the system's
    Python of the same minor version runs it, with this run's packages on its path (they are world-readable).
    """
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join([*(p for p in sys.path if p.endswith("site-packages")), str(REPO)])}
    return subprocess.run([_interpreter(), "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, check=False, env=env, cwd="/", preexec_fn=_drop)


@functools.cache
def _interpreter() -> str:
    for candidate in (sys.executable, f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        try:
            subprocess.run([candidate, "-c", "pass"], check=True, capture_output=True, timeout=30, cwd="/",
                           preexec_fn=_drop)
        except (OSError, subprocess.CalledProcessError):
            continue
        return candidate
    pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} that uid {NOBODY} may run")


@contextlib.contextmanager
def reachable_directory() -> Iterator[Path]:
    """A new directory that uid 65534 may enter (0755, in the system's temporary directory; pytest's own are
    0700, where an attack would fail for that reason alone); removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="rowfilter-attacked-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
