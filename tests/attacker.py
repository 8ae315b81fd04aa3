"""The attackers of the tests: another OS user on the same host, and a database role with CREATE on a database.

Another OS user (issue 28's tests): uid 65534 (``nobody``) running Python code. The tests run as root here;
the attacker is a process of its own that drops to uid/gid 65534 with no supplementary groups before it runs,
with an environment of its own (none of the run's: no PGPASSFILE, no token, no password). Its code prints
what it got; the tests assert that it got nothing.

A role with CREATE on a database and nothing else (issue 42's tests, :func:`plant_shadows`): it makes a
schema that a victim's search_path names (the victim role's ``$user`` schema, or one a connection string asks
for) and puts there an operator and a function that shadow built-ins, which log that they ran and make
every row pass. A session that pins its search_path never calls them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
from airflow_provider_rowfilter.tooling.pg_datadir import LOG_FILE

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


# --- a database role with CREATE on a database ------------------------------------------------------------------
#: The role with only CREATE on the databases it attacks (and what PUBLIC may do).
SQUATTER = "rf_test_mallory"


@dataclass(frozen=True)
class Shadows:
    """What :func:`plant_shadows` planted in ``schema``, and how to tell whether any of it ran."""

    schema: str
    marker: str
    log: Path
    offset: int

    def ran(self) -> list[str]:
        """The server log's lines, since the planting, that say one of the shadows ran (and as whom)."""
        with self.log.open("rb") as f:
            f.seek(self.offset)
            text = f.read().decode("utf-8", "replace")
        return [line for line in text.splitlines() if self.marker in line and " ran as " in line]


def plant_shadows(pg: LocalPostgres, dsn: str, schema: str, tables: tuple[str, ...] = ()) -> Shadows:
    """As :data:`SQUATTER`, granted CREATE on ``dsn``'s database and nothing more: ``CREATE SCHEMA schema`` (usable by
    everyone) holding ``=(varchar, varchar)`` and ``substr(varchar, int, int)``, which beat pg_catalog's
    ``=(text, text)`` and ``substr(text, int, int)`` for a ``varchar`` operand (an exact match wins wherever it is
    in the path: CVE-2018-1058) in any session whose search_path names ``schema``. Each writes ``MARKER ran as
    <current_user>`` to the server log (``RAISE LOG``: a read-only transaction may, a table write it may not) and
    makes the comparison pass: ``=`` answers true, ``substr`` the ``'x'`` the filters compare it with. And a table
    ``(id int, v varchar(10))`` of each name in ``tables``, which a name left unqualified would find first."""
    marker = f"SHADOW-{secrets.token_hex(6)}"
    log = pg.data_dir / LOG_FILE
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (SQUATTER,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(SQUATTER)))
        database = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(str(database)),
                                                                         sql.Identifier(SQUATTER)))
    offset = log.stat().st_size
    body = sql.SQL("BEGIN RAISE LOG '% ran as %', {marker}, current_user; RETURN {result}; END")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(SQUATTER)))
        s = sql.Identifier(schema)
        conn.execute(sql.SQL("CREATE SCHEMA {s}; GRANT USAGE ON SCHEMA {s} TO PUBLIC").format(s=s))
        for signature, returns, result in (("eq(varchar, varchar)", "boolean", "true"),
                                           ("substr(varchar, int, int)", "text", "'x'")):
            conn.execute(sql.SQL("CREATE FUNCTION {s}.{f} RETURNS {r} LANGUAGE plpgsql AS {b}").format(
                s=s, f=sql.SQL(signature), r=sql.SQL(returns),
                b=sql.Literal(body.format(marker=sql.Literal(marker), result=sql.SQL(result)).as_string(conn))))
        conn.execute(sql.SQL("CREATE OPERATOR {s}.= (leftarg = varchar, rightarg = varchar, function = {s}.eq)"
                             ).format(s=s))
        for table in tables:
            conn.execute(sql.SQL("CREATE TABLE {}.{} (id int, v varchar(10))").format(s, sql.Identifier(table)))
    return Shadows(schema, marker, log, offset)
