"""``rowfilter validate`` end to end: the installed console command against a real publisher."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

SCHEMA = """
CREATE TABLE t1 (a int, b int, c text, PRIMARY KEY (a, c));
CREATE TABLE t2 (d int PRIMARY KEY, e int);
"""
PUBLICATIONS = """
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 AND c = 'NSW');
CREATE PUBLICATION p2 FOR TABLE t2 (d) WITH (publish = 'insert');
"""


def rowfilter(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("rowfilter") or str(Path(sys.executable).parent / "rowfilter")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def publisher(fresh_db):
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return dsn


def write_spec(tmp_path: Path, publisher: str, **extra) -> Path:
    spec = tmp_path / "s1.yaml"
    spec.write_text(yaml.safe_dump({"subscription": "s1", "publisher": publisher,
                                    "publications": ["p1", "p2"], **extra}))
    return spec


def test_validate_with_publications_from_a_ddl_file(tmp_path, publisher):
    (tmp_path / "pubs.sql").write_text(PUBLICATIONS)
    result = rowfilter("validate", "--json", "--spec", str(write_spec(tmp_path, publisher, publications_ddl="pubs.sql")))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    tables = {t["table"]: t for t in doc["tables"]}
    assert tables["public.t1"]["filters"]["insert"] == "(a > 5 AND c = 'NSW')"
    assert tables["public.t1"]["spark_filters"]["insert"] == "(`a` > 5 AND `c` = 'NSW')"
    assert tables["public.t2"]["actions"] == ["insert"] and tables["public.t2"]["columns"] == ["d"]


def test_validate_with_publications_from_the_publisher_catalog(tmp_path, publisher):
    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute(PUBLICATIONS)
    result = rowfilter("validate", "--spec", str(write_spec(tmp_path, publisher)))
    assert result.returncode == 0, result.stderr
    assert "publisher catalog" in result.stdout and "valid" in result.stdout
    assert "public.t1" in result.stdout and "NSW" in result.stdout


def test_validate_reports_postgresql_error_and_fails(tmp_path, publisher):
    (tmp_path / "pubs.sql").write_text("CREATE PUBLICATION p1 FOR TABLE t1 WHERE (random() > 0.5);\n"
                                       "CREATE PUBLICATION p2 FOR TABLE t2;")
    result = rowfilter("validate", "--spec", str(write_spec(tmp_path, publisher, publications_ddl="pubs.sql")))
    assert result.returncode == 1
    assert "invalid publication WHERE expression" in result.stderr
    assert "User-defined or built-in mutable functions are not allowed." in result.stderr
    assert "p1" in result.stderr and "public.t1" in result.stderr


def test_validate_rejects_a_password_in_the_url(tmp_path):
    spec = write_spec(tmp_path, "postgresql://u:secret@127.0.0.1:1/db")
    result = rowfilter("validate", "--spec", str(spec))
    assert result.returncode == 1
    assert "carries a password" in result.stderr and "secret" not in result.stderr + result.stdout


@pytest.mark.parametrize("value", ["0", "-5"])
def test_apply_refuses_a_bound_that_is_not_positive(value, capsys):
    from airflow_provider_rowfilter.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["apply", "--spec", "unused.yaml", "--max-changes", value])
    assert exited.value.code == 2
    assert f"argument --max-changes: {value} is not a positive number" in capsys.readouterr().err
