"""The repository keeps its own word: the paths it cites exist, and its lint and type suppressions are checked.

- Every repository path cited in the code (comments, docstrings, messages) and in the docs exists: a
  path under one of the repository's folders (``tests/…``, ``docs/…``), or under the package
  (``flows/apply/drain.py`` as the package's modules cite each other), or relative to the citing file (a
  link between docs pages). PostgreSQL's sources (``src/backend/…``) are not this repository's.
- No ``noqa`` names a rule ruff does not run (pyproject.toml ``[tool.ruff.lint] select``).
- A ``type: ignore`` stands only in a module mypy checks (setup.cfg ``[mypy] files``).
"""

from __future__ import annotations

import ast
import configparser
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "airflow_provider_rowfilter"
FOLDERS = ("airflow_provider_rowfilter", "tests", "docs", "bench", "dags", "scripts")
#: The package's own folders and modules, as its modules cite one another (``core/spec/subscription.py``).
INSIDE = tuple(p.name for p in PACKAGE.iterdir() if not p.name.startswith(("_", ".")))
_PATH = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)+[\w-]+\.(?:py|md|sql|yaml|yml|json|svg|sh|toml|cfg|txt))(?![\w/])")
_NOQA = re.compile(r"#\s*noqa:\s*([A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)")
_IGNORE = re.compile(r"#\s*type:\s*ignore\b")


def _sources() -> list[Path]:
    """The repository's Python and Markdown files: the README and its folders' (not a build's copies)."""
    return sorted([ROOT / "README.md", *(p for folder in FOLDERS for p in (ROOT / folder).rglob("*")
                                         if p.suffix in (".py", ".md") and "__pycache__" not in p.parts)])


def cited_paths(text: str) -> Iterator[tuple[int, str]]:
    """The repository paths ``text`` cites, with their lines: a folder of the repository or of the package
    first; not a placeholder (``<name>``, ``*``, ``test_x.py``)."""
    for match in _PATH.finditer(text):
        path = match.group(1)
        if path.split("/")[0] not in FOLDERS + INSIDE or any(c in path for c in "<>*"):
            continue
        if re.search(r"(^|/)(test_)?x\.py$", path):
            continue
        yield text.count("\n", 0, match.start()) + 1, path


def resolves(path: str, citing: Path) -> bool:
    return any((base / path).exists() for base in (ROOT, PACKAGE, citing.parent, ROOT / "docs"))


def test_every_cited_repository_path_exists() -> None:
    missing = [f"{source.relative_to(ROOT)}:{line}: {path}" for source in _sources()
               for line, path in cited_paths(source.read_text(errors="replace")) if not resolves(path, source)]
    assert missing == []


@pytest.mark.parametrize(("text", "found"), [
    ("see flows/apply/drain.py and docs/apply.md#speed", ["flows/apply/drain.py", "docs/apply.md"]),
    ("(src/backend/replication/logical/worker.c, https://example.org/docs/x.md)", []),
    ("tests/core/test_x.py tests core/x.py; dags/<team>/s1.yaml", []),
])
def test_the_citations_read_are_the_repository_s(text: str, found: list[str]) -> None:
    assert [p for _, p in cited_paths(text)] == found


def test_a_path_that_is_gone_is_caught() -> None:
    assert not resolves("flows/apply/" + "no_such_module.py", PACKAGE / "flows" / "apply" / "drain.py")
    assert resolves("drain.py", PACKAGE / "flows" / "apply" / "batch_plan.py")  # beside the citing file


def test_no_noqa_names_a_rule_that_is_not_run() -> None:
    lint = (ROOT / "pyproject.toml").read_text().split("[tool.ruff.lint]", 1)[1]
    selected = re.findall(r'"([A-Z]+)"', re.search(r"^select\s*=\s*\[(.*?)\]", lint, re.M | re.S).group(1))
    assert "E" in selected and "F" in selected
    wrong = []
    for source in (p for p in _sources() if p.suffix == ".py"):
        for number, line in enumerate(source.read_text().splitlines(), start=1):
            for match in _NOQA.finditer(line):
                for code in (c.strip() for c in match.group(1).split(",")):
                    if not any(code.startswith(rule) and code[len(rule):].isdigit() for rule in selected):
                        wrong.append(f"{source.relative_to(ROOT)}:{number}: {code}")
    assert wrong == []


def test_a_type_ignore_stands_only_where_mypy_looks() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    checked = [ROOT / f.strip() for f in config["mypy"]["files"].split(",")]
    wrong = [str(p.relative_to(ROOT)) for p in _sources() if p.suffix == ".py" and _IGNORE.search(p.read_text())
             and not any(p == c or c in p.parents for c in checked)]
    assert wrong == []


def _imports_of_tests(source: str) -> list[str]:
    """The modules of tests/ a source imports that are test modules or conftests (never to be shared)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found += [n for n in names if n.startswith("tests.") and re.match(r"(test_|conftest$)", n.rsplit(".", 1)[-1])]
    return found


def test_no_test_module_imports_another() -> None:
    """What tests share lives in a helper module beside them (tests/e2e/jobs/conflict_counts.py, tests/airflow/support.py),
    so that running one module never runs or imports another's tests and fixtures."""
    wrong = [f"{p.relative_to(ROOT)}: {name}" for p in sorted((ROOT / "tests").rglob("*.py"))
             for name in _imports_of_tests(p.read_text())]
    assert wrong == []


def test_an_import_of_a_test_module_is_caught() -> None:
    assert _imports_of_tests("from tests.e2e.jobs.test_apply_drain import BATCH\nimport tests.airflow.conftest\n"
                             "from tests.e2e.jobs.drain_scenario import BATCH") == ["tests.e2e.jobs.test_apply_drain",
                                                                              "tests.airflow.conftest"]
