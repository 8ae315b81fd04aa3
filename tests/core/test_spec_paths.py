"""Issue 28, item 3: the files a spec names stay in its folder, and an error about one quotes only SQL.

As found: ``publications_ddl`` pointed at airflow.cfg (absolute, ``../`` or a symlink) was read, and the
SQL error quoted ``LINE 1925: jwt_secret = …`` in the command's output and the refresh task's log.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from airflow_provider_rowfilter.core.errors import PublicationError, RowFilterError, SpecError
from airflow_provider_rowfilter.core.publication.catalog import PublisherCatalog
from airflow_provider_rowfilter.core.publication.ddl import publications_from_ddl
from airflow_provider_rowfilter.core.publication.script_excerpt import looks_secret, mask_secrets
from airflow_provider_rowfilter.core.spec.paths import ALLOWED_PATHS_ENV
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

SECRET = "Zk8x2Qv9mP3nR7tY1wE5uI0oA4sD6fG"
AIRFLOW_CFG = f"""[core]
dags_folder = /opt/airflow/dags
# it's where the DAGs are
[api_auth]
jwt_secret = {SECRET}
[database]
sql_alchemy_conn = postgresql://airflow:{SECRET}@db/airflow
"""


@pytest.fixture
def folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A spec folder and, beside it, a folder holding an airflow.cfg with a secret."""
    monkeypatch.delenv(ALLOWED_PATHS_ENV, raising=False)
    specs, config = tmp_path / "dags", tmp_path / "airflow"
    specs.mkdir()
    config.mkdir()
    (config / "airflow.cfg").write_text(AIRFLOW_CFG)
    return specs, config


def _spec(folder: Path, ddl: str) -> Path:
    path = folder / "s1.yaml"
    path.write_text(f"subscription: s1\npublications: [p1]\npublications_ddl: {ddl}\n")
    return path


@pytest.mark.parametrize("how", ["absolute", "up", "symlink", "symlinked-folder"])
def test_publications_ddl_outside_the_spec_s_folder_is_refused(folders, how):
    specs, config = folders
    ddl = {"absolute": str(config / "airflow.cfg"), "up": "../airflow/airflow.cfg", "symlink": "pubs.sql",
           "symlinked-folder": "sql/airflow.cfg"}[how]
    (specs / "pubs.sql").symlink_to(config / "airflow.cfg")
    (specs / "sql").symlink_to(config)
    with pytest.raises(SpecError) as e:
        SubscriptionSpec.load(_spec(specs, ddl))
    text = str(e.value)
    assert f"publications_ddl {ddl!r} is outside the spec file's folder {str(specs)!r}" in text, text
    assert ALLOWED_PATHS_ENV in text and SECRET not in text


def test_the_deployment_may_allow_a_folder(folders, monkeypatch):
    specs, config = folders
    (config / "pubs.sql").write_text("CREATE PUBLICATION p1 FOR ALL TABLES;\n")
    monkeypatch.setenv(ALLOWED_PATHS_ENV, str(config))
    spec = SubscriptionSpec.load(_spec(specs, "../airflow/pubs.sql"))
    assert spec.publications_ddl == str(config / "pubs.sql")
    assert spec.publications_sql() == "CREATE PUBLICATION p1 FOR ALL TABLES;\n"


def test_a_file_replaced_by_a_symlink_after_the_check_is_not_read(folders):
    specs, config = folders
    (specs / "pubs.sql").write_text("CREATE PUBLICATION p1 FOR ALL TABLES;\n")
    spec = SubscriptionSpec.load(_spec(specs, "pubs.sql"))
    (specs / "pubs.sql").unlink()
    (specs / "pubs.sql").symlink_to(config / "airflow.cfg")
    with pytest.raises(SpecError, match="pubs.sql' of subscription 's1' is a symbolic link") as e:
        spec.publications_sql()
    assert SECRET not in str(e.value)


def _error(script: str) -> RowFilterError:
    with pytest.raises(RowFilterError) as e:
        publications_from_ddl(script, PublisherCatalog({}))
    return e.value


@pytest.mark.parametrize("script", [
    AIRFLOW_CFG,  # an unterminated quote on line 3: the scanner's error
    f"jwt_secret = '{SECRET}\n",
    f'{{"token": "{SECRET}"}}\n',
    f"AWS_SECRET_ACCESS_KEY={SECRET}/K7MDENG\n",  # parses as an expression: an unexpected statement
    f"[core]\nsql_alchemy_conn = postgresql://airflow:{SECRET}@db/airflow\n",
], ids=["airflow-cfg", "assignment", "json", "env-file", "ini"])
def test_an_error_about_a_file_that_is_not_sql_quotes_none_of_it(script, caplog):
    error = _error(script)
    text = str(error)
    assert SECRET not in text and "jwt_secret" not in text and "airflow" not in text, text
    assert "LINE" not in text, text
    assert "publications_ddl" in text or "CREATE, ALTER and DROP PUBLICATION" in text, text
    assert SECRET not in caplog.text  # sqlglot logs a statement it cannot parse, whole: not while we parse


def test_a_scanner_error_in_a_sql_file_names_the_line_as_psql_does():
    error = _error("CREATE PUBLICATION p1 FOR ALL TABLES;\n\nCREATE PUBLICATION p2 FOR TABLE t WHERE (c = 'abc);\n"
                   f"jwt_secret = {SECRET}\n")
    text = str(error)
    # PostgreSQL's message and caret; the token it quotes cut at its line, the other statement not shown.
    assert text.startswith('unterminated quoted string at or near "\'abc);…"\n  LINE 3: '), text
    assert re.search(r"LINE 3: +CREATE PUBLICATION p2 FOR TABLE t WHERE \(c = 'abc\);\n +\^", text), text
    assert SECRET not in text and "p1" not in text


def test_a_secret_looking_literal_in_the_statement_is_masked():
    error = _error(f"CREATE PUBLICATION p1 FOR TABLE t WHERE (api_key = '{SECRET}' AND b = 'x' \x01);\n")
    text = str(error)
    assert SECRET not in text and "'" + "*" * len(SECRET) + "'" in text and "b = 'x'" in text, text


def test_an_unexpected_statement_is_named_by_its_kind_only():
    assert "a SELECT statement" in str(_error(f"SELECT '{SECRET}';\n"))
    error = _error("CREATE ROLE app PASSWORD 'hunter2';\n")
    assert isinstance(error, PublicationError) and "a CREATE statement" in str(error) and "hunter2" not in str(error)


@pytest.mark.parametrize(("value", "word", "secret"), [
    (SECRET, None, True), ("NSW", None, False), ("hunter2", "password", True), ("2025-01-01", None, False),
    ("a b c d e f g h i j k l m n", None, False), ("abcdefghijklmnopqrstuvwxyz", None, False),
    ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", None, True), ("x", "jwt_secret", True),
])
def test_looks_secret(value, word, secret):
    assert looks_secret(value, word) is secret


def test_mask_keeps_positions():
    text = f"WHERE token = '{SECRET}' AND region = 'NSW'"
    masked = mask_secrets(text)
    assert len(masked) == len(text) and SECRET not in masked and "'NSW'" in masked
    assert os.path.commonprefix([masked, text]) == "WHERE token = '"


# Every quoting form of PostgreSQL's scanner (src/backend/parser/scan.l): the review of issue 42 found dollar quotes,
# E'…', U&'…' and quoted identifiers quoted unmasked in error excerpts.
@pytest.mark.parametrize("template", [
    "a = '{s}'", "a = E'{s}'", "a = e'it\\'s {s}'", "a = U&'{s}' UESCAPE '!'", "a = $${s}$$", "a = $tag${s};$tag$",
    '"{s}" = 1', 'U&"{s}" = 1', "a = X'{s}'", "a = N'{s}'", "a = B'{s}'", "a = '{s}\nsecond line'",
    "a = 1 -- {s}", "a = 1 /* outer /* {s} */ still comment */",
])
def test_every_quoting_form_is_masked(template):
    text = "CREATE PUBLICATION p1 FOR TABLE t WHERE (" + template.format(s=SECRET) + " AND b = 'NSW');"
    masked = mask_secrets(text)
    assert SECRET not in masked and len(masked) == len(text) and masked.count("\n") == text.count("\n"), masked
    assert "b = 'NSW'" in masked  # what is not secret stays


def test_a_semicolon_inside_a_dollar_quote_or_an_e_string_does_not_end_the_statement():
    from airflow_provider_rowfilter.core.publication.script_excerpt import statement_span

    for first in ("CREATE PUBLICATION p1 FOR TABLE t WHERE (a = $x$;$x$);",
                  "CREATE PUBLICATION p1 FOR TABLE t WHERE (a = E'\\';');",
                  "CREATE PUBLICATION p1 FOR TABLE t /* ; /* ; */ ; */ WHERE (a = 1);"):
        assert statement_span(first + "\nCREATE PUBLICATION p2;", 0) == (0, len(first)), first
