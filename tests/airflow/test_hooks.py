"""RowFilterHook: connections to password-less libpq URLs, and the spec from a file and/or arguments."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.hooks.rowfilter import RowFilterHook, libpq_url


@pytest.mark.parametrize(
    ("args", "url"),
    [
        (("db.example", 5432, "replicator", "app", {}), "postgresql://replicator@db.example:5432/app"),
        (("10.0.0.5", None, "u", None, {}), "postgresql://u@10.0.0.5"),
        (("::1", 5433, "u", "d", {}), "postgresql://u@[::1]:5433/d"),
        (("h", 5432, "a@b:c", "my db/x", {}), "postgresql://a%40b%3Ac@h:5432/my%20db%2Fx"),
        (("h", 5432, "u", "d", {"sslmode": "verify-full", "sslrootcert": "/etc/ca.pem", "sslpassword": "k3y",
                                "cursor": "dictcursor", "connect_timeout": 10}),
         "postgresql://u@h:5432/d?connect_timeout=10&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"),
        ((None, None, None, "d", {}), "postgresql:///d"),
    ],
    ids=["plain", "no-port-no-db", "ipv6", "quoted", "libpq-extras-only", "socket-default"],
)
def test_libpq_url_never_holds_a_password_and_parses_back(args: tuple[Any, ...], url: str) -> None:
    assert libpq_url(*args) == url
    parsed = psycopg.conninfo.conninfo_to_dict(url)
    assert "password" not in parsed and "sslpassword" not in parsed
    host, port, login, database, _ = args
    assert (parsed.get("host"), parsed.get("user"), parsed.get("dbname")) == (host, login, database)
    assert parsed.get("port") == (str(port) if port else None)


def test_keyword_fields_override_the_spec_file(tmp_path: Path, airflow_conn: Callable[..., str]) -> None:
    pub = airflow_conn({"conn_type": "postgres", "host": "pub.example", "port": 5432, "login": "rep",
                        "password": "pw-0123456789", "schema": "app"}, "pub")
    (tmp_path / "s.yaml").write_text("subscription: s1\npublisher: postgresql://old@h/app\n"
                                     "subscriber: postgresql://sub@h/sink\npublications: [p1]\ncopy_data: false\n")
    resolved = RowFilterHook().resolve_spec(spec=str(tmp_path / "s.yaml"),
                                            fields={"publications": "p1, p2", "publisher_conn_id": pub,
                                                    "copy_data": None},
                                            base_dir=str(tmp_path))
    spec = resolved.spec
    assert (spec.publications, spec.copy_data) == (("p1", "p2"), False)
    assert (spec.publisher, spec.publisher_conn_id) == ("postgresql://rep@pub.example:5432/app", pub)
    assert spec.subscriber == "postgresql://sub@h/sink"  # a URL from the file: libpq's own password sources
    assert resolved.password_env() == {"ROWFILTER_PUBLISHER_PASSWORD": "pw-0123456789"}
    assert "pw-0123456789" not in repr(resolved) and "pw-0123456789" not in spec.to_json()


def test_relative_paths_are_taken_from_the_dag_folder(tmp_path: Path, airflow_conn: Callable[..., str]) -> None:
    conn = airflow_conn("postgresql://u@h:5432/d", "pg")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "s.yaml").write_text(f"subscription: s1\npublications: [p1]\npublisher_conn_id: {conn}\n"
                                               f"subscriber_conn_id: {conn}\n")
    spec = RowFilterHook().resolve_spec(spec="specs/s.yaml", fields={"publications_ddl": "sql/pubs.sql"},
                                        base_dir=str(tmp_path)).spec
    assert spec.publications_ddl == str(tmp_path / "sql" / "pubs.sql")


@pytest.mark.parametrize(("value", "refused"), [("s3://bucket/subs/s1", None), ("s3a://bucket/s1", "s3a://")])
def test_a_change_log_url_given_to_the_operator_is_never_a_path_of_the_dag_folder(
        tmp_path: Path, airflow_conn: Callable[..., str], value: str, refused: str | None) -> None:
    """Issue 32: the operator's change_log went through the DAG folder's join, so s3://… became <dags>/s3:/…"""
    conn = airflow_conn("postgresql://u@h:5432/d", "pg")
    fields = {"subscription": "s1", "publications": ["p1"], "publisher_conn_id": conn, "subscriber_conn_id": conn,
              "change_log": value}
    if refused:
        with pytest.raises(SpecError, match=f"the URL scheme {refused} is not served"):
            RowFilterHook().resolve_spec(fields=fields, base_dir=str(tmp_path))
    else:
        assert RowFilterHook().resolve_spec(fields=fields, base_dir=str(tmp_path)).spec.change_log == value
    assert list(tmp_path.iterdir()) == []


def test_unknown_operator_field_is_refused() -> None:
    with pytest.raises(SpecError, match="'publisher' is not a spec field an operator takes"):
        RowFilterHook().resolve_spec(fields={"subscription": "s1", "publisher": "postgresql://u@h/d"})


@pytest.mark.parametrize(
    ("tables", "refusal"),
    [
        (["a.b.c"], "tables: 'a.b.c' is not a table name"),
        ("public.t1,public.", "tables: 'public.' is not a table name"),
        (["public.t1", " "], "tables=['public.t1', ' '] is not a list of table names"),
    ],
    ids=["three-parts", "no-name", "blank-entry"],
)
def test_the_sensor_refuses_tables_the_copy_operator_refuses(tables: Any, refusal: str) -> None:
    # One parser for the sensor, the trigger, the DAG factory and SnapshotCopyOperator: a name the
    # operator refuses is not waited for (for ever) by the sensor.
    from airflow_provider_rowfilter.hooks.subscription_rel import parse_tables

    with pytest.raises(SpecError, match="is not a") as e:
        parse_tables(tables)
    assert str(e.value).startswith(refusal)
    assert parse_tables(" t2 , public.t1,,t2") == [TableName("public", "t1"), TableName("public", "t2")]
    assert parse_tables("") is None and parse_tables(None) is None


def test_the_change_log_store_s_credentials_come_from_an_airflow_connection(airflow_conn: Callable[..., str]) -> None:
    """Issue 32: an ``aws``, ``google_cloud_platform`` or ``wasb`` connection gives the store's SDK its standard
    environment (handed to the task's run and the job by environment, like the passwords)."""
    from airflow_provider_rowfilter.hooks.store_connection import store_environment
    aws = airflow_conn({"conn_type": "aws", "login": "AKIAEXAMPLE", "password": "s3cr/et",
                        "extra": {"region_name": "eu-west-1", "endpoint_url": "http://127.0.0.1:9000",
                                  "aws_session_token": "tok"}}, "aws")
    assert store_environment(aws) == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr/et",
                                      "AWS_SESSION_TOKEN": "tok", "AWS_REGION": "eu-west-1",
                                      "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    gcp = airflow_conn({"conn_type": "google_cloud_platform", "extra": {"key_path": "/secrets/sa.json"}}, "gcp")
    assert store_environment(gcp) == {"GOOGLE_APPLICATION_CREDENTIALS": "/secrets/sa.json"}
    pg = airflow_conn("postgresql://u@h:5432/d", "pg")
    with pytest.raises(SpecError, match=rf"change_log_conn_id '{pg}' is a 'postgres' connection, not an object store"):
        store_environment(pg)
    with pytest.raises(SpecError, match="change_log_conn_id 'rf_nowhere': no such Airflow connection"):
        store_environment("rf_nowhere")


def test_operators_take_the_store_connection_from_the_spec_file_unless_given_one(
        airflow_conn: Callable[..., str], tmp_path: Path) -> None:
    """A DAG factory spec file's ``change_log_conn_id`` gives the operators' runs the store's credentials; the operator
    argument of that name wins over it."""
    from airflow_provider_rowfilter.operators.refresh_publication import RefreshPublicationOperator
    in_file = airflow_conn({"conn_type": "aws", "login": "AKIAFILE", "password": "file/secret"}, "aws")
    given = airflow_conn({"conn_type": "aws", "login": "AKIAGIVEN", "password": "given/secret"}, "aws")
    spec = tmp_path / "s1.yaml"
    spec.write_text("subscription: s1\npublications: [p1]\npublisher: postgresql://u@h/pub\n"
                    f"subscriber: postgresql://u@h/sub\nchange_log: s3://bucket/s1\nchange_log_conn_id: {in_file}\n")
    from_file = RefreshPublicationOperator(task_id="refresh", spec=str(spec)).resolve_spec()
    assert from_file.store_env == {"AWS_ACCESS_KEY_ID": "AKIAFILE", "AWS_SECRET_ACCESS_KEY": "file/secret"}
    overridden = RefreshPublicationOperator(task_id="refresh", spec=str(spec), change_log_conn_id=given).resolve_spec()
    assert overridden.store_env["AWS_ACCESS_KEY_ID"] == "AKIAGIVEN"
