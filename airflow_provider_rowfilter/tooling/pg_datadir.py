"""The local cluster's data directory (tooling/embedded.py): initdb with this package's settings and a superuser
password, a password given to a cluster made before passwords, the server started on a free port.

Nothing here keeps state: :class:`~airflow_provider_rowfilter.tooling.embedded.LocalPostgres` is the running
cluster.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

from airflow_provider_rowfilter.spark.processes import alive
from airflow_provider_rowfilter.tooling.embedded_auth import (
    PASSFILE,
    PG_HBA,
    new_password,
    scram_verifier,
    write_passfile,
    write_private_text,
)
from airflow_provider_rowfilter.tooling.pg_host import HOST, LocalPostgresError, OsUser, free_port, port_is_free

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"
START_ATTEMPTS = 5

# Appended to postgresql.conf after initdb. Logical decoding needs wal_level=logical; the worker,
# slot and sender limits leave room for several native subscriptions (each takes an apply worker,
# table-sync workers, a slot and a WAL sender) used as referees beside our own slots.
SERVER_SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    # TCP only: the compiled-in socket directory (/tmp or /var/run/postgresql) may not be
    # writable by the server's OS user, and a second cluster would collide there.
    "unix_socket_directories": "''",
    "max_connections": "200",
    "wal_level": "logical",
    "max_wal_senders": "20",
    "max_replication_slots": "20",
    "max_worker_processes": "32",
    "max_logical_replication_workers": "16",
    "max_sync_workers_per_subscription": "4",
    "fsync": "off",
    # Left on, deliberately: logical decoding (the slot SQL functions and walsenders) only reads WAL
    # that is flushed, so with asynchronous commit a committed change could stay invisible to a
    # slot for up to three wal_writer_delay cycles. With fsync=off a synchronous commit costs one
    # write() and no disk flush, so "on" keeps reads of the slot deterministic at no real cost.
    "synchronous_commit": "on",
    "full_page_writes": "off",
    # The default from 14 on; set for older binaries (bin_dir=) so that every role's password is a verifier.
    "password_encryption": "'scram-sha-256'",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
}
# Settings that older servers reject as unknown, by the major version that introduced them.
# PostgreSQL 18 split replication origins (one per subscription) out of max_replication_slots.
SERVER_SETTINGS_SINCE: dict[int, dict[str, str]] = {18: {"max_active_replication_origins": "20"}}

# The pg_hba.conf of clusters made before passwords (every local user a superuser): replaced at start.
OLD_TRUST_HBA = "# Written by airflow_provider_rowfilter.tooling.embedded: trust, loopback only."

LOG_FILE = "postgresql.log"


def require_passwords(data: Path, bin_dir: Path, user: OsUser) -> None:
    """A cluster made before passwords (or whose password file is gone): a new superuser password, set in
    single-user mode before the server listens, and this module's pg_hba.conf instead of its trust lines."""
    hba = data / "pg_hba.conf"
    trusting = hba.exists() and hba.read_text().startswith(OLD_TRUST_HBA)
    if (data / PASSFILE).exists() and not trusting:
        return
    password = new_password()
    # The verifier travels on the backend's standard input, never on a command line (docs/local-postgres.md).
    out = user.run([str(bin_dir / "postgres"), "--single", "-D", str(data), "-c", "exit_on_error=on", SUPERUSER],
                   stdin=f"ALTER ROLE {SUPERUSER} PASSWORD '{scram_verifier(password)}'\n", check=False)
    if "ERROR" in out or "FATAL" in out:
        raise LocalPostgresError(f"could not set the superuser's password of the cluster in {str(data)!r}",
                                 detail=out.strip()[-2000:], hint="is another server running on this data directory?")
    write_passfile(data / PASSFILE, SUPERUSER, password, uid=user.uid, gid=user.gid)
    if trusting:
        hba.write_text(PG_HBA)
        if user.switch:
            os.chown(hba, user.uid, user.gid)
    logger.info("The superuser of the cluster in %s now has a password (in %s)", data, data / PASSFILE)


def initdb(data: Path, bin_dir: Path, user: OsUser) -> None:
    """A new cluster in ``data``: initdb as the server's OS user, the superuser's password (never on a command
    line), :data:`SERVER_SETTINGS` and this package's pg_hba.conf."""
    data.mkdir(parents=True, exist_ok=True)
    if user.switch:
        os.chown(data, user.uid, user.gid)
    data.chmod(0o700)
    user.grant_traverse(data.parent)
    password = new_password()
    # initdb reads the password from a file (--pwfile), never from its command line: the verifier, in a
    # 0700 directory of the server's OS user that is removed at once.
    with tempfile.TemporaryDirectory(prefix="rowfilter-initdb-") as private:
        pwfile = Path(private) / "pwfile"
        write_private_text(pwfile, scram_verifier(password) + "\n", uid=user.uid, gid=user.gid)
        if user.switch:
            os.chown(private, user.uid, user.gid)
        user.run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                f"--username={SUPERUSER}",
                # No moment of trust: initdb's own pg_hba.conf asks for the password too.
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "--locale=C",
                "--encoding=UTF8",
                # Durability of a throwaway cluster does not matter; skipping fsync saves most of initdb.
                "--no-sync",
                "--no-instructions",
            ]
        )
    major = int((data / "PG_VERSION").read_text().split(".")[0])
    settings = dict(SERVER_SETTINGS)
    for since, extra in SERVER_SETTINGS_SINCE.items():
        if major >= since:
            settings.update(extra)
    block = "\n".join(f"{name} = {value}" for name, value in settings.items())
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"\n# Added by airflow_provider_rowfilter.tooling.embedded\n{block}\n")
    (data / "pg_hba.conf").write_text(PG_HBA)
    write_passfile(data / PASSFILE, SUPERUSER, password, uid=user.uid, gid=user.gid)


def start_server(data: Path, bin_dir: Path, user: OsUser, port: int | None) -> int:
    """Start the server of ``data`` on ``port`` (default: its previous port when free, else a free one, retried
    when taken meanwhile); return the port once it accepts connections."""
    log = data / LOG_FILE
    attempts = 1 if port is not None else START_ATTEMPTS
    for attempt in range(1, attempts + 1):
        chosen = (
            port if port is not None else (_previous_port(data) if attempt == 1 else None) or free_port()
        )
        offset = log.stat().st_size if log.exists() else 0
        out = user.run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-w",
                "-t",
                "60",
                "-o",
                f"-p {chosen}",
                "start",
            ],
            check=False,
        )
        if (data / "postmaster.pid").exists() and ready_postmaster(data) is not None:
            return chosen
        tail = _read_from(log, offset)
        if "could not bind" in tail or "Address already in use" in tail:
            logger.info("Port %d was taken (attempt %d of %d)", chosen, attempt, attempts)
            continue
        raise LocalPostgresError(
            f"PostgreSQL did not start in {str(data)!r}: {out.strip()}",
            detail=tail[-4000:],
            hint=f"see {log}",
        )
    raise LocalPostgresError(
        f"PostgreSQL could not bind a port on {HOST} after {attempts} attempt(s)",
        hint="pass port= a free port",
    )


def ready_postmaster(data: Path) -> tuple[int, Path] | None:
    """The port and the ``postgres`` binary of the server running in ``data`` and accepting connections, or None."""
    try:
        pid_lines = (data / "postmaster.pid").read_text().splitlines()
        binary = Path(shlex.split((data / "postmaster.opts").read_text())[0])
    except (OSError, IndexError, ValueError):
        return None
    # postmaster.pid: pid, data dir, start time, port, socket dir, listen address, shmem, status.
    if len(pid_lines) < 8 or pid_lines[7].strip() != "ready" or not alive(int(pid_lines[0])):
        return None
    return int(pid_lines[3]), binary


def check_major_version(data: Path, bin_dir: Path) -> None:
    """Refuse to start a cluster with binaries of another major version (the server would fail obscurely)."""
    cluster = (data / "PG_VERSION").read_text().strip()
    out = subprocess.run(
        [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=False
    )
    match = re.search(r"\)\s+(\d+)", out.stdout)
    if match is not None and match.group(1) != cluster.split(".")[0]:
        raise LocalPostgresError(
            f"the cluster in {str(data)!r} is PostgreSQL {cluster}, the binaries in {str(bin_dir)!r} are {match.group(1)}",
            hint="start it with binaries of its own version (bin_dir=), or use another data directory",
        )


def _previous_port(data: Path) -> int | None:
    """Return the port of the cluster's previous start when it is free again."""
    try:
        args = shlex.split((data / "postmaster.opts").read_text())
        port = int(args[args.index("-p") + 1])
    except (OSError, ValueError, IndexError):
        return None
    return port if port_is_free(port) else None


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", "replace")
    except OSError:
        return ""
