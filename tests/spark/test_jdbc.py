"""libpq URLs as JDBC URLs and properties, with the password from the environment only."""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.spark.jdbc import jdbc_connection

ENV = "ROWFILTER_PUBLISHER_PASSWORD"


@pytest.mark.parametrize(("url", "jdbc", "properties"), [
    pytest.param("postgresql://rep@db.example:6432/app?sslmode=require", "jdbc:postgresql://db.example:6432/app",
                 {"user": "rep", "sslmode": "require"}, id="url"),
    pytest.param("host=h1,h2 port=5433 dbname=my%db user=u connect_timeout=7", "jdbc:postgresql://h1:5433,h2:5433/my%25db",
                 {"user": "u", "connectTimeout": "7"}, id="key-value-multi-host"),
    pytest.param("postgresql://u@[::1]:5432/d", "jdbc:postgresql://[::1]:5432/d", {"user": "u"}, id="ipv6"),
])
def test_jdbc_connection(monkeypatch, url, jdbc, properties):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    connection = jdbc_connection(url, ENV, "rowfilter:s1")
    assert connection.url == jdbc
    assert connection.properties == {**properties, "ApplicationName": "rowfilter:s1"}


def test_password_comes_from_the_environment_and_is_not_shown(monkeypatch):
    monkeypatch.setenv(ENV, "s3cret")
    connection = jdbc_connection("postgresql://u@h/d", ENV, "a")
    assert connection.properties["password"] == "s3cret"
    assert "s3cret" not in repr(connection)


def test_a_unix_socket_is_refused():
    with pytest.raises(SpecError, match="Unix-domain socket"):
        jdbc_connection("host=/var/run/postgresql dbname=d user=u", ENV, "a")
