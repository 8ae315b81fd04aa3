"""How the local PostgreSQL (tooling/embedded.py) authenticates: SCRAM-SHA-256 for every connection.

There is no ``trust`` line: another OS user on the host reaches 127.0.0.1 as easily as the cluster's
owner, and a superuser session runs programs as the server's OS user (``COPY … FROM PROGRAM``). The
superuser's password is generated when the cluster is initialised and kept in a libpq password file
(:data:`PASSFILE`, mode 0600, owned by the server's OS user) inside the 0700 data directory; the
cluster's DSN names it (``passfile=``), so the OS user that owns the cluster (and root) connects as
before and nobody else can. Roles for applications get passwords of their own
(:func:`role_statement`), given to libpq as for any server.

Passwords reach PostgreSQL only as SCRAM verifiers (:func:`scram_verifier`), never as text: not in a
statement a log could keep, not on a command line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from psycopg import sql

#: The superuser's password file, in the data directory (libpq's format, ``hostname:port:database:username:password``).
PASSFILE = "rowfilter-superuser.pgpass"
#: PostgreSQL's default iteration count for SCRAM (``scram_iterations``, src/backend/libpq/auth-scram.c).
SCRAM_ITERATIONS = 4096

PG_HBA = """\
# Written by airflow_provider_rowfilter.tooling.embedded: loopback only, every connection with a password
# (SCRAM-SHA-256). The superuser's is in rowfilter-superuser.pgpass, readable by the cluster's owner only.
host    all          all   127.0.0.1/32  scram-sha-256
host    replication  all   127.0.0.1/32  scram-sha-256
host    all          all   ::1/128       scram-sha-256
host    replication  all   ::1/128       scram-sha-256
"""


def new_password() -> str:
    """A random password: 256 bits, URL-safe characters (nothing libpq's password file would need to escape)."""
    return secrets.token_urlsafe(32)


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (``pg_authid.rolpassword``).

    RFC 5802 and 7677, as src/common/scram-common.c computes it; PostgreSQL keeps a verifier given as the
    password as it is (src/backend/libpq/crypt.c ``encrypt_password``). ``password`` is SASLprep'd there;
    the ASCII passwords made here are their own SASLprep form.
    """
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def write_passfile(path: Path, user: str, password: str, *, uid: int | None = None, gid: int | None = None) -> None:
    """Write libpq's password file for ``user`` on the loopback addresses, any port and database: mode 0600
    whatever the umask, owned by ``uid``/``gid`` when given (the server's OS user)."""
    lines = "".join(f"{host}:*:*:{user}:{password}\n" for host in ("127.0.0.1", "localhost", "\\:\\:1"))
    write_private_text(path, lines, uid=uid, gid=gid)


def write_private_text(path: Path, text: str, *, uid: int | None = None, gid: int | None = None) -> None:
    """Write ``text`` to ``path`` (replaced whole) with mode 0600 whatever the umask, owned by ``uid``/``gid``."""
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        if uid is not None and uid != os.geteuid():
            os.fchown(fd, uid, gid if gid is not None else -1)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)


def role_statement(name: str, password: str, *, superuser: bool = False, replication: bool = False,
                   create: bool = True) -> sql.Composed:
    """``CREATE ROLE`` (or ``ALTER ROLE``) ``name`` ``LOGIN`` with ``password`` as a SCRAM verifier."""
    options = [sql.SQL("LOGIN"), sql.SQL("SUPERUSER" if superuser else "NOSUPERUSER"),
               sql.SQL("REPLICATION" if replication else "NOREPLICATION")]
    return sql.SQL("{} ROLE {} {} PASSWORD {}").format(
        sql.SQL("CREATE" if create else "ALTER"), sql.Identifier(name), sql.SQL(" ").join(options),
        sql.Literal(scram_verifier(password)))
