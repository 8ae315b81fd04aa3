"""Connection strings: find a password in any form libpq reads, refuse it, and redact it for messages.

A publisher or subscriber connection string travels in the spec, and the spec travels as JSON on the
spark-submit, java and python command lines, readable by every local user. So a password must never
be in one, in any form libpq accepts: the URL's user info (``postgresql://u:pw@h``), a URL query
parameter (``?password=pw``, ``?pass%77ord=pw``), or a ``key=value`` string (``password='p w'``).
The password comes from the environment instead (:data:`PASSWORD_ENV`, ``PGPASSWORD``), a
``~/.pgpass`` file, or an Airflow connection's password field.

:func:`parse` mirrors libpq's two parsers, ``conninfo_parse`` and ``conninfo_uri_parse_options`` (with
``conninfo_uri_parse_params`` and ``conninfo_uri_decode``) in src/interfaces/libpq/fe-connect.c,
and is tested against libpq itself (tests/core/test_conninfo.py). It is pure Python so that the
spec (core/) can check its strings where they are read; the pg layer parses with psycopg when it
connects.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_rowfilter.core.errors import SpecError

#: Environment variables a job reads the publisher's and subscriber's passwords from (connection.py).
PASSWORD_ENV = {"publisher": "ROWFILTER_PUBLISHER_PASSWORD", "subscriber": "ROWFILTER_SUBSCRIBER_PASSWORD"}
#: Connection parameters that are secrets: the server password, the client key's passphrase, and
#: libpq 18's SCRAM keys and OAuth client secret.
SECRET_KEYS = ("password", "sslpassword", "scram_client_key", "scram_server_key", "oauth_client_secret")
URI_PREFIXES = ("postgresql://", "postgres://")  # fe-connect.c, uri_prefix_length (case-sensitive)
MASK = "********"
_SPACE = " \t\n\v\f\r"  # isspace() in the C locale


class ConninfoError(ValueError):
    """The string is not a connection string libpq reads. The reason never quotes the string."""


@dataclass(frozen=True)
class Param:
    """One connection parameter: its keyword and value as libpq stores them, and where the value is written.

    ``where`` says which form set it ("user info", "query parameter", "key=value"); ``span`` is the
    value's (start, end) in the string, quotes and escapes included.
    """

    key: str
    value: str
    where: str
    span: tuple[int, int]


def parse(conninfo: str) -> list[Param]:
    """The parameters ``conninfo`` sets, in order (a later one of the same keyword wins in libpq).

    Keywords are not checked against libpq's list (that list grows with each release; libpq itself
    refuses an unknown one when it connects, naming only the keyword).

    :raises ConninfoError: where libpq's parser would fail.
    """
    if conninfo.startswith(URI_PREFIXES):
        return _parse_uri(conninfo)
    return _parse_key_value(conninfo)


def secrets(conninfo: str) -> list[Param]:
    """The parameters that carry a secret: a :data:`SECRET_KEYS` key (in any letter case), or any
    other whose value hides one (``dbname=app#password=pw``, ``sslmode=disable%26password%3Dpw``).

    libpq takes such a value whole and echoes it in its errors and the server's (``database
    "app#password=pw" does not exist``, ``invalid sslmode value: "disable&password=pw"``).
    """
    return [p for p in parse(conninfo) if p.key.lower() in SECRET_KEYS or _hides_secret(p.value)]


def _hides_secret(value: str) -> bool:
    lowered = value.lower()
    return any(f"{key}=" in lowered for key in SECRET_KEYS)


#: The parameters a connection error may name: where the server is, who connects, to which database.
SHOWN_KEYS = ("host", "hostaddr", "port", "user", "dbname")


def scrub(message: str, conninfo: str) -> str:
    """``message`` (libpq's or the server's error text) with every quoted value of ``conninfo``'s
    parameters other than :data:`SHOWN_KEYS` replaced by ``********``.

    libpq quotes a value it refuses (fe-connect.c: ``invalid sslmode value: "…"``) and the server a
    name it cannot find (postinit.c: ``database "…" does not exist``); both quote with ``"``.
    """
    try:
        params = parse(conninfo)
    except ConninfoError:
        return message
    shown = {p.value for p in params if p.key.lower() in SHOWN_KEYS and not _hides_secret(p.value)}
    for param in sorted(params, key=lambda p: len(p.value), reverse=True):
        if param.value and param.value not in shown:
            message = message.replace(f'"{param.value}"', f'"{MASK}"')
    return message


def check_no_password(conninfo: str, what: str, role: str | None = None) -> None:
    """Refuse a connection string that holds a password or does not parse, without quoting the string.

    :param what: what the string is, for the message ("the publisher of spec file 's1.yaml'").
    :param role: ``publisher``/``subscriber``: names the job's environment variable in the hint.
    :raises SpecError: naming the key and where the password must come from instead.
    """
    try:
        found = secrets(conninfo)
    except ConninfoError as e:
        raise SpecError(f"{what} is not a valid connection string: {e}",
                        hint="write a libpq URL (postgresql://user@host:port/db) or key=value string; "
                        "it is not shown here because it may hold a password") from None
    if conninfo.startswith(URI_PREFIXES) and "#" in conninfo:
        # fe-connect.c, conninfo_uri_parse_options: a URL has no fragment; '#' and what follows are
        # part of the database name or a query value, sent to the server and echoed in its errors.
        raise SpecError(f"{what} has a '#' in its URL: libpq has no URL fragment and reads the '#' and what "
                        f"follows as part of a value: {redact(conninfo)}",
                        hint="remove the '#' part, or write a '#' that belongs to a name as %23")
    if not found:
        return
    param = found[0]
    form = {"user info": "user:password@ in the URL", "query parameter": f"the URL query parameter {param.key!r}",
            "key=value": f"the key {param.key!r}", "path": "the database name of the URL",
            "netloc": "the host or port of the URL"}[param.where]
    if param.key.lower() not in SECRET_KEYS:
        raise SpecError(f"{what} hides a password inside the value of {param.key} ({form}): {redact(conninfo)}",
                        hint="remove it: libpq would send the value whole (and the server echo it in an error). "
                        "Give the password by PGPASSWORD, ~/.pgpass or an Airflow connection's password")
    if param.key.lower() == "password":
        env = f"{PASSWORD_ENV[role]} (a job), " if role in PASSWORD_ENV else ""
        fix = (f"PGPASSWORD or ~/.pgpass (the rowfilter command), {env}or the password of an Airflow connection "
               "(publisher_conn_id / subscriber_conn_id)")
    else:
        fix = "a libpq service file (PGSERVICEFILE; then service=name in the connection string)"
    raise SpecError(f"{what} carries a {param.key} ({form}): {redact(conninfo)}",
                    hint=f"remove it: the spec travels on command lines every local user can read. Give the "
                    f"{param.key} by {fix}")


def redact(conninfo: str) -> str:
    """``conninfo`` with each secret value replaced by ``********``, fit for a message or a log line.

    A string that does not parse cannot be told apart into parts: all of it but a URL's scheme is
    hidden.
    """
    try:
        found = secrets(conninfo)
    except ConninfoError:
        scheme = next((p for p in URI_PREFIXES if conninfo.startswith(p)), "")
        return f"{scheme}{MASK} (hidden: it does not parse)"
    text = conninfo
    for param in sorted(found, key=lambda p: p.span, reverse=True):
        start, end = param.span
        text = text[:start] + MASK + text[end:]
    if text.startswith(URI_PREFIXES) and "#" in text:  # libpq reads on past a '#': hide what follows
        text = text[: text.index("#")] + "#" + MASK
    return text


# --- key=value (fe-connect.c, conninfo_parse) ----------------------------------------------------------
def _parse_key_value(conninfo: str) -> list[Param]:
    params: list[Param] = []
    i, n = 0, len(conninfo)
    while i < n:
        if conninfo[i] in _SPACE:  # skip blanks before the parameter name
            i += 1
            continue
        start = i
        while i < n and conninfo[i] != "=" and conninfo[i] not in _SPACE:
            i += 1
        key = conninfo[start:i]
        while i < n and conninfo[i] in _SPACE:
            i += 1
        if i >= n or conninfo[i] != "=":
            raise ConninfoError('missing "=" after a keyword')
        i += 1
        while i < n and conninfo[i] in _SPACE:  # skip blanks after the '='
            i += 1
        value_start, value = i, []
        if i < n and conninfo[i] == "'":
            i += 1
            while True:
                if i >= n:
                    raise ConninfoError("unterminated quoted string")
                if conninfo[i] == "\\":
                    i += 1
                    if i < n:
                        value.append(conninfo[i])
                        i += 1
                    continue
                if conninfo[i] == "'":
                    i += 1
                    break
                value.append(conninfo[i])
                i += 1
            value_end = i
        else:
            while i < n and conninfo[i] not in _SPACE:
                if conninfo[i] == "\\":
                    i += 1
                    if i < n:
                        value.append(conninfo[i])
                        i += 1
                else:
                    value.append(conninfo[i])
                    i += 1
            value_end = i
        params.append(Param(key, "".join(value), "key=value", (value_start, value_end)))
    return params


# --- URIs (fe-connect.c, conninfo_uri_parse_options) ---------------------------------------------------
def _parse_uri(uri: str) -> list[Param]:
    params: list[Param] = []
    p = next(len(prefix) for prefix in URI_PREFIXES if uri.startswith(prefix))
    n = len(uri)
    start = p
    while p < n and uri[p] not in "@/":  # look ahead for the user credentials designator
        p += 1
    if p < n and uri[p] == "@":
        p = start
        while uri[p] not in ":@":
            p += 1
        if p > start:
            params.append(Param("user", _decode(uri[start:p]), "user info", (start, p)))
        if uri[p] == ":":
            password_start = p = p + 1
            while uri[p] != "@":
                p += 1
            if p > password_start:
                params.append(Param("password", _decode(uri[password_start:p]), "user info", (password_start, p)))
        p += 1
    else:
        p = start
    hosts, ports = [], []
    while True:  # netloc[:port], separated by commas
        if p < n and uri[p] == "[":  # an IPv6 address
            p += 1
            host_start = p
            while p < n and uri[p] != "]":
                p += 1
            if p >= n:
                raise ConninfoError('end of string reached when looking for matching "]" in IPv6 host address')
            if p == host_start:
                raise ConninfoError("IPv6 host address may not be empty")
            hosts.append(uri[host_start:p])
            p += 1
            if p < n and uri[p] not in ":/?,":
                raise ConninfoError(f'unexpected character at position {p + 1} (expected ":" or "/")')
        else:
            host_start = p
            while p < n and uri[p] not in ":/?,":
                p += 1
            hosts.append(uri[host_start:p])
        terminator = uri[p] if p < n else ""
        ports.append("")
        if terminator == ":":
            p += 1
            port_start = p
            while p < n and uri[p] not in "/?,":
                p += 1
            ports[-1] = uri[port_start:p]
            terminator = uri[p] if p < n else ""
        if terminator != ",":
            break
        p += 1
    for key, values in (("host", hosts), ("port", ports)):
        if ",".join(values):  # libpq's hostbuf/portbuf: a comma per separator, even between empty parts
            params.append(Param(key, _decode(",".join(values)), "netloc", (0, 0)))
    if terminator and terminator != "?":
        p += 1
        dbname_start = p
        while p < n and uri[p] != "?":
            p += 1
        terminator = uri[p] if p < n else ""
        if p > dbname_start:
            params.append(Param("dbname", _decode(uri[dbname_start:p]), "path", (dbname_start, p)))
    if terminator:
        params.extend(_parse_query(uri, p + 1))
    return params


def _parse_query(uri: str, p: int) -> list[Param]:
    """fe-connect.c, conninfo_uri_parse_params: ``key=value`` pairs separated by ``&``, both percent-decoded."""
    params = []
    n = len(uri)
    while p < n:
        key_start, equals = p, None
        while p < n and uri[p] != "&":
            if uri[p] == "=":
                if equals is not None:
                    raise ConninfoError('extra key/value separator "=" in a URI query parameter')
                equals = p
            p += 1
        if equals is None:
            raise ConninfoError('missing key/value separator "=" in a URI query parameter')
        key, value = _decode(uri[key_start:equals]), _decode(uri[equals + 1:p])
        if key == "ssl" and value == "true":  # libpq's JDBC compatibility
            key, value = "sslmode", "require"
        params.append(Param(key, value, "query parameter", (equals + 1, p)))
        p += 1
    return params


def _decode(text: str) -> str:
    """fe-connect.c, conninfo_uri_decode (libpq 18): spaces around are dropped, a space inside is refused
    (it must be written %20); %XX escapes are decoded; %00 is forbidden."""
    data = text.encode()
    stripped = data.strip(b" ")
    if b" " in stripped:
        raise ConninfoError("unexpected spaces found in a URL part, use percent-encoded spaces (%20) instead")
    raw, i = bytearray(), 0
    while i < len(stripped):
        if stripped[i] != ord("%"):
            raw.append(stripped[i])
            i += 1
            continue
        digits = stripped[i + 1:i + 3]
        if len(digits) < 2 or any(chr(d) not in "0123456789abcdefABCDEF" for d in digits):
            raise ConninfoError("invalid percent-encoded token")
        if int(digits, 16) == 0:
            raise ConninfoError("forbidden value %00 in percent-encoded value")
        raw.append(int(digits, 16))
        i += 3
    return raw.decode(errors="surrogateescape")
