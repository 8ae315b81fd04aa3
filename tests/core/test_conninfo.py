"""core/spec/conninfo.py against libpq itself: the same parameters from every string libpq parses, an error
where libpq's parser fails, every secret found and redacted."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.conninfo import ConninfoError, check_no_password, parse, redact, scrub

KEYWORDS = {o.keyword.decode() for o in pq.Conninfo.get_defaults()}
SECRET = "s3cr3t-Xq9"


def libpq(conninfo: str) -> dict[str, str] | str:
    """What libpq's PQconninfoParse makes of ``conninfo``: the parameters, or its error message."""
    try:
        return {k: str(v) for k, v in conninfo_to_dict(conninfo).items()}
    except psycopg.ProgrammingError as e:
        return str(e)
    except UnicodeDecodeError:  # libpq parsed it; psycopg cannot decode a %-escaped non-UTF-8 value
        assume(False)
        raise


def ours(conninfo: str) -> dict[str, str] | None:
    try:
        return {p.key: p.value for p in parse(conninfo)}
    except ConninfoError:
        return None


def agree(conninfo: str) -> None:
    """Ours parses exactly what libpq parses, to the same parameters; keywords aside (libpq checks them)."""
    theirs, mine = libpq(conninfo), ours(conninfo)
    if isinstance(theirs, dict):
        assert mine == theirs, conninfo
    elif "invalid connection option" in theirs or "invalid URI query parameter" in theirs:
        # libpq stops at the first unknown keyword; ours may instead stop at a later malformed part.
        assert mine is None or set(mine) - KEYWORDS, (conninfo, theirs)
    else:
        assert mine is None, (conninfo, theirs)


CASES = [
    "", "   ", "host=h", "host = h  port= 5432 ", "password='a b\\' c' user=u", "password=a\\ b", "password=",
    "password='", "password='abc", "host=h secret", "=x", "host", "dbname='' user=x\\", "password=\\",
    "postgresql://", "postgres://", "postgresql://u:pw@h/db", "postgresql://u:@h", "postgresql://:pw@h",
    "postgresql://u@h/db?password=pw", "postgresql://h/db?pass%77ord=pw", "postgresql://h/db?password=p%20w&sslmode=disable",
    "postgresql://u:p%40w@h:5432/db", "postgresql://u:p/w@h/db", "postgresql://u:p@ss@h/db", "postgresql://[::1]:5/db",
    "postgresql://[::1/db", "postgresql://[]/db", "postgresql://[::1]x/db", "postgresql://h1:1,h2:2,[::1]/db",
    "postgresql://h,/db", "postgresql://h:,:5/db", "postgresql://h?password", "postgresql://h?password==x",
    "postgresql://h?a=b=c", "postgresql://h/db?ssl=true", "postgresql://h/db?sslpassword=x&password=y",
    "postgresql://u:p%zzw@h", "postgresql://u:p%00w@h", "postgresql://u:p%4@h", "postgresql://h/d%C3%A9",
    "postgresql://h/db?", "postgresql://h/db?&", "postgresql://h/db?password=x&", "postgresql:/h", "POSTGRESQL://u:p@h",
    "postgresql://h?x@y/db", "postgresql://%75:pw@h", "user=u\tpassword=p\nhost=h", "sslpassword='k' password=\"p\"",
]


@pytest.mark.parametrize("conninfo", CASES)
def test_parses_as_libpq(conninfo: str) -> None:
    agree(conninfo)


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(["", "postgresql://", "postgres://"]),
       st.text(alphabet="hpuw=' \\@:/?&,[]%0aF1\tx", max_size=30),
       st.sampled_from(["", "password", "user", "host"]))
def test_random_strings_parse_as_libpq(prefix: str, body: str, key: str) -> None:
    agree(prefix + body.replace("x", key))


@pytest.mark.parametrize(("conninfo", "key", "form"), [
    pytest.param(f"postgresql://u:{SECRET}@h/db", "password", "user:password@ in the URL", id="url-user-info"),
    pytest.param(f"postgresql://u@h/db?password={SECRET}", "password", "the URL query parameter 'password'",
                 id="url-query"),
    pytest.param(f"postgresql://u@h/db?pass%77ord={SECRET}", "password", "the URL query parameter 'password'",
                 id="url-query-percent-encoded-key"),
    pytest.param(f"postgresql://u@h/db?sslmode=require&sslpassword={SECRET}", "sslpassword",
                 "the URL query parameter 'sslpassword'", id="url-sslpassword"),
    pytest.param(f"host=h password={SECRET}", "password", "the key 'password'", id="key-value"),
    pytest.param(f"host=h password = '{SECRET} \\' x'", "password", "the key 'password'", id="key-value-quoted"),
    pytest.param(f"host=h PASSWORD={SECRET}", "PASSWORD", "the key 'PASSWORD'", id="key-value-upper-case"),
    pytest.param(f"host=h scram_client_key={SECRET}", "scram_client_key", "the key 'scram_client_key'",
                 id="scram-key"),
])
def test_a_secret_is_refused_naming_the_key_and_the_fix(conninfo: str, key: str, form: str) -> None:
    with pytest.raises(SpecError) as e:
        check_no_password(conninfo, "the publisher of 's1.yaml'", "publisher")
    text = str(e.value)
    assert f"the publisher of 's1.yaml' carries a {key} ({form})" in text
    assert ("ROWFILTER_PUBLISHER_PASSWORD" in text and "~/.pgpass" in text) or key != "password"
    assert SECRET not in text and "********" in text


@pytest.mark.parametrize("conninfo", [
    pytest.param(f"postgresql://u:{SECRET}@[::1/db", id="unclosed-ipv6"),
    pytest.param(f"postgresql://u:{SECRET}%zz@h/db", id="bad-percent"),
    pytest.param(f"postgresql://h/db?{SECRET}", id="query-without-equals"),
    pytest.param(f"host=h {SECRET}", id="key-value-without-equals"),
    pytest.param(f"host=h password='{SECRET}", id="unterminated-quote"),
])
def test_a_malformed_string_is_refused_without_quoting_it(conninfo: str) -> None:
    assert isinstance(libpq(conninfo), str)  # libpq refuses it too (and most of its messages quote the string)
    with pytest.raises(SpecError, match="is not a valid connection string") as e:
        check_no_password(conninfo, "the subscriber", "subscriber")
    assert SECRET not in str(e.value) and SECRET not in redact(conninfo)


@pytest.mark.parametrize(("conninfo", "redacted"), [
    (f"postgresql://u:{SECRET}@h/db?password={SECRET}&sslmode=disable",
     "postgresql://u:********@h/db?password=********&sslmode=disable"),
    (f"host=h password='{SECRET} x' user=u", "host=h password=******** user=u"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
])
def test_redact(conninfo: str, redacted: str) -> None:
    assert redact(conninfo) == redacted


def test_a_string_without_a_secret_passes() -> None:
    for conninfo in ("postgresql://u@h:5432/db?sslmode=require", "host=h user=u dbname=d", "", "postgresql://u:@h"):
        check_no_password(conninfo, "the publisher")


# A password hidden inside another value: libpq sends the value whole and echoes it in its errors and
# the server's (database "app#password=…" does not exist; invalid sslmode value: "disable&password=…").
@pytest.mark.parametrize(("conninfo", "message"), [
    pytest.param(f"postgresql://repl@127.0.0.1:55431/app#password={SECRET}", "has a '#' in its URL",
                 id="url-hash-in-dbname"),
    pytest.param(f"postgresql://repl@127.0.0.1:55431/app?sslmode=disable%26password%3D{SECRET}",
                 "hides a password inside the value of sslmode (the URL query parameter 'sslmode')",
                 id="url-encoded-ampersand"),
    pytest.param(f"postgresql://repl@h/app?options=-c%20PassWord%3D{SECRET}",
                 "hides a password inside the value of options", id="url-upper-case"),
    pytest.param(f"postgresql://repl@h/app%3Fpassword={SECRET}", "hides a password inside the value of dbname "
                 "(the database name of the URL)", id="url-dbname"),
    pytest.param(f"host=h dbname='app password={SECRET}'", "hides a password inside the value of dbname "
                 "(the key 'dbname')", id="key-value-quoted"),
    pytest.param("postgresql://repl@h/app#section", "has a '#' in its URL", id="url-fragment"),
])
def test_a_password_hidden_in_another_value_is_refused(conninfo: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        check_no_password(conninfo, "the publisher", "publisher")
    text = str(e.value)
    assert f"the publisher {message}" in text, text
    assert SECRET not in text and "section" not in text and "********" in text


def test_a_hash_written_as_percent_23_passes() -> None:
    check_no_password("postgresql://repl@h/app%23one", "the publisher")


def test_scrub_keeps_host_port_user_and_dbname_only() -> None:
    url = f"postgresql://repl@db.example:5433/app?sslmode={SECRET}&application_name=app"
    assert scrub(f'invalid sslmode value: "{SECRET}"', url) == 'invalid sslmode value: "********"'
    text = 'connection to server at "db.example", port 5433 failed: FATAL:  database "app" does not exist'
    assert scrub(text, url) == text


def test_a_connection_error_quotes_no_other_value(local_pg) -> None:
    """libpq's own error quotes the refused value: the message printed shows it masked."""
    from types import SimpleNamespace

    from airflow_provider_rowfilter.connection import connect
    from airflow_provider_rowfilter.core.errors import RowFilterError

    dsn = local_pg.dsn()
    url = f"{dsn}{'&' if '?' in dsn else '?'}sslmode={SECRET}"
    with pytest.raises(RowFilterError) as e:
        connect(url, "publisher", SimpleNamespace(subscription="s1"))
    assert SECRET not in str(e.value) and '"********"' in str(e.value), str(e.value)
