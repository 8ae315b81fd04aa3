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


# A row filter is a security boundary: a file whose filter PostgreSQL cannot read must stop
# validation with PostgreSQL's message, the place and the fix, never pass as "all rows" nor end in a
# traceback. In process (cli.main), so the message is the one the command prints.
P2 = b"\nCREATE PUBLICATION p2 FOR TABLE t2;\n"
BAD_FILTERS = [
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE ();", ['syntax error at or near ")"', "publication 'p1'",
                 "table t1", "LINE 1:", "leave WHERE out"], id="where-empty"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (/* every row */);", ['syntax error at or near ")"'],
                 id="where-comment-only"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (-- every row\n);",
                 ['syntax error at or near ")"', "LINE 2:"], id="where-line-comment-only"),
    pytest.param("CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a\u00a0> 5);".encode(),
                 ['column "a\u00a0" does not exist', "U+00A0", "p1", "public.t1"], id="no-break-space"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a\x1c> 5);", ['syntax error at or near "\x1c"', "U+001C"],
                 id="control-character"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (c = 'NSW);", ["unterminated quoted string at or near",
                 "close the string"], id="unterminated-string"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 /* x);", ["unterminated /* comment at or near"],
                 id="unterminated-comment"),
    pytest.param(b'CREATE PUBLICATION p1 FOR TABLE t1 WHERE ("a > 5);', ["unterminated quoted identifier"],
                 id="unterminated-identifier"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (c = $x$NSW);", ["unterminated dollar-quoted string"],
                 id="unterminated-dollar-quote"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (c = E'\\xe9');",
                 ['invalid byte sequence for encoding "UTF8": 0xe9'], id="e-string-invalid-byte"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (c = 'Gen\xe8ve');",
                 ['invalid byte sequence for encoding "UTF8": 0xe8 at byte 50 (line 1)', "pubs.sql", "UTF-8"],
                 id="file-not-utf8"),
    # PostgreSQL's grammar has no empty IN list, no empty or trailing-comma column list and no empty
    # parenthesised expression: each is a syntax error at or near ")", never a filter or a list.
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a IN ());", ['syntax error at or near ")"'],
                 id="where-empty-in-list"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (());", ['syntax error at or near ")"'],
                 id="where-empty-parentheses"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 (a, ) WHERE (a > 5);", ['syntax error at or near ")"'],
                 id="column-list-trailing-comma"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 ();", ['syntax error at or near ")"'],
                 id="column-list-empty"),
    pytest.param(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5) WHERE (a < 9);", ['syntax error at or near "WHERE"'],
                 id="second-where"),
]


@pytest.mark.parametrize("ddl, expected", BAD_FILTERS)
def test_validate_refuses_an_unreadable_filter(tmp_path, publisher, capsys, ddl: bytes, expected: list[str]):
    from airflow_provider_rowfilter.cli import main

    (tmp_path / "pubs.sql").write_bytes(ddl + P2)
    code = main(["validate", "--spec", str(write_spec(tmp_path, publisher, publications_ddl="pubs.sql"))])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    for fragment in expected:
        assert fragment in err, err


def test_validate_accepts_dollar_quotes_and_odd_whitespace(tmp_path, publisher, capsys):
    from airflow_provider_rowfilter.cli import main

    (tmp_path / "pubs.sql").write_bytes(b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a\v>\f5 AND c = $$NSW$$);" + P2)
    code = main(["validate", "--json", "--spec", str(write_spec(tmp_path, publisher, publications_ddl="pubs.sql"))])
    out = capsys.readouterr()
    assert code == 0, out.err
    tables = {t["table"]: t for t in json.loads(out.out)["tables"]}
    assert tables["public.t1"]["spark_filters"]["insert"] == "(`a` > 5 AND `c` = 'NSW')"


@pytest.mark.parametrize("value", ["0", "-5"])
def test_apply_refuses_a_bound_that_is_not_positive(value, capsys):
    from airflow_provider_rowfilter.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["apply", "--spec", "unused.yaml", "--max-changes", value])
    assert exited.value.code == 2
    assert f"argument --max-changes: {value} is not a positive number" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "message"), [
    ("-1", "-1 is not a number of seconds of 0 or more"),
    ("nan", "nan is not a number of seconds of 0 or more"),
    ("inf", "inf is not a number of seconds of 0 or more"),
    ("4m", "'4m' is not a number of seconds"),
])
def test_apply_refuses_a_time_budget_that_is_not_seconds(value, message, capsys):
    from airflow_provider_rowfilter.cli import main
    from airflow_provider_rowfilter.jobs.apply import main as job_main

    for run in (lambda: main(["apply", "--spec", "unused.yaml", "--time-budget", value]),
                lambda: job_main(["--spec", "unused.yaml", "--time-budget", value])):
        with pytest.raises(SystemExit) as exited:
            run()
        assert exited.value.code == 2
        assert f"argument --time-budget: {message}" in capsys.readouterr().err


def test_validate_shows_the_filtering_mode_per_table_and_warns_what_the_publisher_will_refuse(tmp_path, publisher):
    # Spark cannot evaluate a back reference exactly, and e is outside t2's replica identity: both are PostgreSQL's to judge
    # when the publisher filters (filtering: source); validate accepts them, warning about the publisher's UPDATE.
    with psycopg.connect(publisher, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION p1 FOR TABLE t1 WHERE (c ~ '^(N)\\1');"
                     "CREATE PUBLICATION p2 FOR TABLE t2 WHERE (e > 0)")
    result = rowfilter("validate", "--json", "--spec", str(write_spec(tmp_path, publisher)))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["filtering"] == "source" and {t["filtering"] for t in doc["tables"]} == {"source"}
    tables = {t["table"]: t for t in doc["tables"]}
    assert "cannot be evaluated by Spark" in tables["public.t1"]["spark_untranslatable"]
    (warning,) = doc["warnings"]
    assert 'cannot update table "t2"' in warning and "WARNING:" in result.stderr
    text = rowfilter("validate", "--spec", str(write_spec(tmp_path, publisher)))
    assert text.returncode == 0 and "filtering: source (the publisher's pgoutput)" in text.stdout, text.stderr

    refused = rowfilter("validate", "--spec", str(write_spec(tmp_path, publisher, filtering="spark")))
    assert refused.returncode == 1 and "cannot be evaluated by Spark" in refused.stderr
