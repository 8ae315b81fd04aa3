"""A libpq URL as Spark's JDBC reader wants it: ``jdbc:postgresql://host:port/db`` plus properties."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from urllib.parse import quote

import psycopg

from airflow_provider_rowfilter.core.errors import SpecError

# libpq parameters with the same meaning in the PostgreSQL JDBC driver (pgjdbc), by pgjdbc's name.
_PASSED_THROUGH = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "connect_timeout": "connectTimeout",
    "options": "options",
}


@dataclass(frozen=True)
class JdbcConnection:
    """A JDBC URL and its connection properties (``user``, ``password``, …)."""

    url: str
    properties: dict[str, str] = field(default_factory=dict, repr=False)  # may hold the password

    def __repr__(self) -> str:
        return f"JdbcConnection({self.url!r}, user={self.properties.get('user')!r})"


def jdbc_connection(url: str, password_env: str, application_name: str) -> JdbcConnection:
    """Translate a libpq URL or key=value string; the password comes from ``password_env`` or ``PGPASSWORD``."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    # libpq's defaults where the URL is silent; no host means localhost (JDBC speaks TCP only).
    hosts = str(params.get("host") or os.environ.get("PGHOST") or "localhost").split(",")
    ports = str(params.get("port") or os.environ.get("PGPORT") or "5432").split(",")
    if any(h.startswith("/") for h in hosts):
        raise SpecError("the JDBC reader cannot use a Unix-domain socket directory as host",
                        hint="give the database's TCP host name or address in the URL (host=127.0.0.1)")
    if len(ports) == 1:
        ports = ports * len(hosts)
    netloc = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in zip(hosts, ports, strict=True))
    user = str(params.get("user") or os.environ.get("PGUSER") or getpass.getuser())
    dbname = str(params.get("dbname") or os.environ.get("PGDATABASE") or user)
    properties = {"user": user, "ApplicationName": application_name}
    password = params.get("password") or os.environ.get(password_env) or os.environ.get("PGPASSWORD")
    if password:
        properties["password"] = str(password)
    for libpq, jdbc in _PASSED_THROUGH.items():
        if params.get(libpq):
            properties[jdbc] = str(params[libpq])
    return JdbcConnection(f"jdbc:postgresql://{netloc}/{quote(dbname, safe='')}", properties)
