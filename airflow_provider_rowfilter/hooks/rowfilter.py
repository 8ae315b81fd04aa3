"""Turn Airflow connections and operator arguments into the subscription spec the jobs read.

The spec crosses the Airflow -> Spark boundary as JSON on the spark-submit command line, so it
never holds a password: a ``postgres`` connection becomes a libpq URL without one, and its password
travels apart, as the environment variable the job's ``pg.definitions.connect`` reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_rowfilter.connection import open_session
from airflow_provider_rowfilter.core.errors import SpecError, UnreachableError
from airflow_provider_rowfilter.core.spec.conninfo import PASSWORD_ENV, redact, scrub
from airflow_provider_rowfilter.core.spec.log_location import is_url
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.spec.values import CONN_ID

ROLES = ("publisher", "subscriber")
POSTGRES_CONN_TYPES = ("postgres", "postgresql")
# Connection extras that are libpq connection parameters and hold no secret (sslpassword does).
LIBPQ_EXTRAS = (
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "sslcompression",
    "sslnegotiation", "ssl_min_protocol_version", "ssl_max_protocol_version", "requiressl",
    "gssencmode", "krbsrvname", "gsslib", "channel_binding", "require_auth", "connect_timeout",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
    "target_session_attrs", "load_balance_hosts", "options", "passfile", "service",
)
# Operator keyword arguments that are spec keys (the URL keys stay in spec files: operators take
# connection ids instead).
SPEC_KEYWORDS = ("subscription", "publications", "publisher_conn_id", "subscriber_conn_id",
                 "publications_ddl", "copy_data", "spark_conf", "change_log")


@dataclass(frozen=True)
class Endpoint:
    """Where a publisher or subscriber is: a libpq URL without password, and the password apart."""

    conn_id: str | None
    url: str
    password: str | None = field(default=None, repr=False)
    role: str = "database"

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``open_session(url, **kwargs)`` (connection.py)."""
        return {"password": self.password} if self.password else {}

    def connect(self, **params: Any) -> psycopg.Connection:
        """An autocommit connection (for reading state), its search_path pinned (connection.py ``open_session``);
        ``params`` more libpq parameters (``connect_timeout``).

        :raises UnreachableError: naming the Airflow connection and the host, with libpq's reason.
        """
        try:
            return open_session(self.url, **params, **self.connect_kwargs())
        except psycopg.OperationalError as e:
            host = str(psycopg.conninfo.conninfo_to_dict(self.url).get("host") or "localhost")
            text = scrub(str(e).strip(), self.url)
            raise UnreachableError(f"cannot connect to the {self.role} at host {host} (Airflow connection "
                                   f"{self.conn_id!r})", detail=text.splitlines()[0] if text else None) from None


@dataclass(frozen=True)
class ResolvedSpec:
    """A spec ready for a job, and the passwords that must reach the job by environment only."""

    spec: SubscriptionSpec
    endpoints: Mapping[str, Endpoint] = field(default_factory=dict, repr=False)
    #: the change log's object-store credentials from ``change_log_conn_id`` (hooks/store_connection.py)
    store_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    def connect(self, role: str) -> psycopg.Connection:
        """Open an autocommit connection to the publisher or subscriber (for reading its state), its search_path
        pinned."""
        endpoint = self.endpoints.get(role)
        if endpoint is not None:
            return endpoint.connect()
        # A URL from a spec file: libpq's own PGPASSWORD / ~/.pgpass, as for the rowfilter command.
        return open_session(getattr(self.spec, role))

    def password_env(self) -> dict[str, str]:
        """``{"ROWFILTER_PUBLISHER_PASSWORD": …, …}`` for the endpoints that have a password, and the change log's
        store credentials (``AWS_…``) when an Airflow connection gives them."""
        return {**{PASSWORD_ENV[role]: e.password for role, e in self.endpoints.items() if e.password},
                **self.store_env}


class RowFilterHook(BaseHook):
    """Build the subscription spec for the rowfilter jobs from a spec file and/or operator arguments.

    Connections are Airflow ``postgres`` connections: host, port, login, password, schema (the
    database) and the libpq parameters among the extras (``sslmode``, ``sslrootcert``, …).
    Nothing is read in ``__init__``; connections are looked up when a spec is resolved.
    """

    hook_name = "Row Filter (PostgreSQL logical replication)"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)

    # --- connections ---------------------------------------------------------------------------------
    @classmethod
    def endpoint(cls, conn_id: str, role: str = "database") -> Endpoint:
        """Resolve an Airflow ``postgres`` connection to a password-less URL and the password."""
        try:
            conn = cls.get_connection(conn_id)
        except AirflowNotFoundException as e:
            raise _missing(conn_id, role) from e
        return _endpoint(conn, conn_id, role)

    @classmethod
    async def aendpoint(cls, conn_id: str, role: str = "database") -> Endpoint:
        """:meth:`endpoint` for async code (triggers): looks the connection up without blocking."""
        try:
            conn = await cls.aget_connection(conn_id)
        except AirflowNotFoundException as e:
            raise _missing(conn_id, role) from e
        return _endpoint(conn, conn_id, role)

    # --- the spec ------------------------------------------------------------------------------------
    def resolve_spec(self, *, spec: str | None = None, fields: Mapping[str, Any] | None = None,
                     base_dir: str | None = None, require: Sequence[str] = ROLES) -> ResolvedSpec:
        """Merge a spec file with keyword fields, resolve connection ids, and validate the result.

        :param spec: path of a YAML spec file; relative paths are taken from ``base_dir``.
        :param fields: spec keys given as operator arguments; those not None override the file's.
            A ``publisher_conn_id``/``subscriber_conn_id`` given here replaces the file's URL.
        :param base_dir: directory for relative paths given as fields (``publications_ddl``,
            ``change_log``): the DAG's folder.
        :param require: the roles the job connects to; each needs a URL or a connection id.
        :raises SpecError: on anything a retry cannot fix.
        """
        given = {k: v for k, v in (fields or {}).items() if v is not None}
        unknown = sorted(set(given) - set(SPEC_KEYWORDS))
        if unknown:
            raise SpecError(f"{unknown[0]!r} is not a spec field an operator takes",
                            hint=f"operator spec fields: {', '.join(SPEC_KEYWORDS)}")
        data: dict[str, Any] = {}
        source = "operator arguments"
        if spec:
            path = _absolute(spec, base_dir)
            loaded = SubscriptionSpec.load(path)
            data = {k: v for k, v in vars(loaded).items() if k != "spec_version"}
            source = f"spec file {path!r}"
        for role in ROLES:
            if f"{role}_conn_id" in given:
                data.pop(role, None)
        data.update(given)
        if "publications" in data:
            data["publications"] = _names(data["publications"], "publications")
        for key in ("publications_ddl", "change_log"):  # paths given to the operator: from the DAG's folder
            if data.get(key) and key in given and isinstance(data[key], str) and not is_url(data[key]):
                data[key] = _absolute(data[key], base_dir)
        if "subscription" not in data:
            raise SpecError("no subscription name", hint="pass subscription='s1' or spec='path/to/s1.yaml'")
        checked = SubscriptionSpec.from_dict(data, source=source)  # every key's type and value, before any lookup
        endpoints: dict[str, Endpoint] = {}
        for role in ROLES:
            conn_id, url = getattr(checked, f"{role}_conn_id"), getattr(checked, role)
            if conn_id and url:
                raise SpecError(f"{source} sets both {role} ({redact(url)!r}) and {role}_conn_id ({conn_id!r})",
                                hint=f"keep one: {role}_conn_id for Airflow, {role} URL for the rowfilter command")
            if conn_id:
                endpoints[role] = self.endpoint(conn_id, role)
            elif role in require and not url:
                raise SpecError(f"subscription {checked.subscription!r} has no {role}",
                                hint=f"pass {role}_conn_id= an Airflow postgres connection id")
        # A standby named by its connection id is reached with the publisher's password (connection.py ``password``).
        standbys = tuple(self.endpoint(s, "standby").url if CONN_ID.match(s) else s for s in checked.standbys)
        urls: dict[str, Any] = {role: e.url for role, e in endpoints.items()}
        resolved = replace(checked, standbys=standbys, **urls)
        return ResolvedSpec(resolved, endpoints)

    @staticmethod
    def with_master(resolved: ResolvedSpec, master: str) -> ResolvedSpec:
        """The spec with ``spark_master`` set to where spark-submit sends the job."""
        return replace(resolved, spec=replace(resolved.spec, spark_master=master))


def libpq_url(host: str | None, port: int | None, login: str | None, database: str | None,
              extra: Mapping[str, Any] | None = None, *, hosts: Sequence[tuple[str, int | None]] = ()) -> str:
    """``postgresql://user@host:port/db?sslmode=…``: a libpq URL that never carries a password; with ``hosts``,
    one of several servers (``postgresql://user@h1:p1,h2:p2/db``: libpq tries each in turn)."""
    netloc = ""
    if login:
        netloc = quote(login, safe="") + "@"
    netloc += ",".join(_host_port(h, p) for h, p in (hosts or [(host or "", port)]))
    path = "/" + quote(database, safe="") if database else ""
    params = {k: str(v) for k, v in (extra or {}).items() if k in LIBPQ_EXTRAS and v not in (None, "")}
    query = "?" + urlencode(sorted(params.items())) if params else ""
    return f"postgresql://{netloc}{path}{query}"


def _host_port(host: str, port: int | None) -> str:
    text = "" if not host else f"[{host}]" if ":" in host and not host.startswith("[") else quote(host, safe="/[]")
    return text + (f":{int(port)}" if port else "")


def connection_hosts(conn_id: str, host: str | None, port: int | None,
                     extra: Mapping[str, Any]) -> list[tuple[str, int | None]]:
    """The servers of a connection that names several (a primary and its standbys, on their own ports): the extra
    ``hosts`` (``"db1:5432,db2:5433"`` or a list, IPv6 as ``[::1]:5432``), optionally with ``ports`` (a list, or
    libpq's ``"5432,5433"``) for hosts given without one, as libpq's ``host=db1,db2 port=5432,5433`` reads them.
    Airflow's own host and port hold one server (its URI form refuses two host:port pairs); when set too they must
    be the first of ``hosts``. [] when the extra names none."""
    listed = extra.get("hosts")
    if listed in (None, "", []):
        return []
    bad = SpecError(f"connection {conn_id!r}: extra hosts={listed!r} ports={extra.get('ports')!r} is not a list of "
                    "servers", hint='extra {"hosts": "db1:5432,db2:5433"} (or a list), or {"hosts": "db1,db2", '
                    '"ports": "5432,5433"}')
    names = _items(listed)
    ports = _items(extra.get("ports"))
    if names is None or ports is None or not all(names) or not all(p.isdigit() for p in ports):
        raise bad
    if ports and len(ports) not in (1, len(names)):
        raise SpecError(f"connection {conn_id!r}: extra ports lists {len(ports)} ports for {len(names)} hosts",
                        hint="one port for all, or one per host (libpq's rule)")
    servers: list[tuple[str, int | None]] = []
    for i, name in enumerate(names):
        h, p = _split_host(name)
        if p is None and ports:
            p = int(ports[i if len(ports) > 1 else 0])
        servers.append((h, p if p is not None else port))
    if host and (servers[0][0] != host or (port and servers[0][1] != port)):
        raise SpecError(f"connection {conn_id!r} sets host {host!r}" + (f" port {port}" if port else "") +
                        f" and extra hosts {listed!r}, which does not start with it",
                        hint="leave the connection's host empty and list every server in hosts, or list it first")
    return servers


def _items(value: Any) -> list[str] | None:
    """A comma-separated string, a number or a list, as strings ([] for nothing; None: not such a value)."""
    if value in (None, ""):
        return []
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [str(value)]
    if isinstance(value, str):
        return [v.strip() for v in value.split(",")]
    if isinstance(value, list | tuple):
        return [str(v).strip() for v in value]
    return None


def _split_host(text: str) -> tuple[str, int | None]:
    """``db1:5433`` -> (db1, 5433); ``[::1]:5432`` -> (::1, 5432); ``db1`` -> (db1, None)."""
    if text.startswith("["):
        inside, _, rest = text[1:].partition("]")
        return inside, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if text.count(":") == 1:
        name, _, port = text.partition(":")
        if port.isdigit():
            return name, int(port)
    return text, None


def _endpoint(conn: Any, conn_id: str, role: str) -> Endpoint:
    if conn.conn_type not in POSTGRES_CONN_TYPES:
        raise SpecError(f"{role}_conn_id={conn_id!r} is a connection of type {conn.conn_type!r}",
                        hint="use a connection of type 'postgres' (postgresql://… in AIRFLOW_CONN_*)")
    extra = dict(conn.extra_dejson or {})
    hosts = connection_hosts(conn_id, conn.host, conn.port, extra)
    if len(hosts) > 1 and role != "standby":
        # Several servers: the one that accepts writes, as the publisher's and subscriber's sessions need (the
        # capture advances its slot, the apply writes), unless the extra says otherwise.
        extra.setdefault("target_session_attrs", "read-write")
    return Endpoint(conn_id, libpq_url(conn.host, conn.port, conn.login, conn.schema, extra, hosts=hosts),
                    conn.password or None, role)


def _missing(conn_id: str, role: str) -> SpecError:
    return SpecError(f"{role}_conn_id={conn_id!r}: no such Airflow connection",
                     hint=f"create it (Admin > Connections, `airflow connections import <a file only you can read>` "
                     f"holding {{\"{conn_id}\": {{\"conn_type\": \"postgres\", …}}}}, or the "
                     f"AIRFLOW_CONN_{conn_id.upper()} environment variable; never a password on a command line) or "
                     "fix the id")


def _absolute(path: str, base_dir: str | None) -> str:
    if os.path.isabs(path) or not base_dir:
        return os.path.abspath(path)
    return os.path.join(base_dir, path)


def _names(value: Any, setting: str) -> tuple[str, ...]:
    """A list of names from a list, a tuple, or a comma-separated string (what Jinja renders)."""
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise SpecError(f"{setting}={value!r} is not a list of names",
                    hint=f"pass {setting}=['a', 'b'] or a comma-separated string 'a,b'")
