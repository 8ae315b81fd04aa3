"""Prove the import layering: core is pure Python, io (psycopg, pyarrow) imports neither Airflow nor Spark,
spark never Airflow, Airflow code never Spark, and no layer imports the tooling.

Each layer's modules are found with pkgutil (new modules are covered without editing this file)
and imported in a fresh interpreter whose meta path refuses the forbidden top-level packages.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import airflow_provider_rowfilter

PACKAGE = airflow_provider_rowfilter.__name__

# Top-level names inside the package -> the layer they belong to. Every name must be listed:
# a new top-level module or subpackage fails test_every_top_level_name_has_a_layer until it is.
LAYER_OF = {
    "__init__": "core",
    "get_provider_info": "core",
    "core": "core",
    # psycopg and pyarrow: the two databases and the change log between them.
    "connection": "io",
    "identifiers": "io",
    "publisher": "io",
    "subscriber": "io",
    "change_log": "io",
    "spark": "spark",
    # The console command runs the Spark jobs (README "Use"); Airflow stays out of it.
    "cli": "spark",
    # How the console command prints a table (Rich only): the terminal is its I/O.
    "cli_output": "io",
    # How it shows a long copy or drain on a terminal (Rich only).
    "cli_progress": "io",
    # Thin entry points of the Spark jobs (submitted by the operators, run by the CLI).
    "jobs": "spark",
    "hooks": "airflow",
    "operators": "airflow",
    "sensors": "airflow",
    "triggers": "airflow",
    "plugins": "airflow",
    # Builds DAGs from spec files: Airflow's side of the boundary.
    "dag_factory": "airflow",
    # The DAGs standing for a spec file the factory cannot build.
    "spec_placeholders": "airflow",
    # The local PostgreSQL, the native referee and the demo: they may use every layer, none uses them.
    "tooling": "tooling",
}
TOOLING = f"{PACKAGE}.tooling"
FORBIDDEN = {
    "core": ("airflow", "pyspark", "psycopg", "pyarrow", "numpy", TOOLING),
    "io": ("airflow", "pyspark", TOOLING),
    "spark": ("airflow", TOOLING),
    "airflow": ("pyspark", TOOLING),
    "tooling": (),
}
# Layers that must hold at least one module today; the others are checked once they exist.
REQUIRED_LAYERS = {"core", "io", "spark", "airflow", "tooling"}

IMPORT_WITH_BLOCKED = textwrap.dedent(
    """
    import importlib, json, sys, traceback
    from importlib.abc import MetaPathFinder

    blocked, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])

    class Blocker(MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if any(fullname == b or fullname.startswith(b + ".") for b in blocked):
                raise ModuleNotFoundError(f"import of {fullname!r} is blocked in this layer", name=fullname)
            return None

    sys.meta_path.insert(0, Blocker())
    imported, failed = [], {}
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:
            failed[module] = traceback.format_exc(limit=-6)
        else:
            imported.append(module)
    leaked = sorted(n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in blocked))
    print(json.dumps({"imported": imported, "failed": failed, "leaked": leaked}))
    """
)


def _modules() -> dict[str, list[str]]:
    """Return every module of the package, by layer."""
    by_layer: dict[str, list[str]] = {layer: [] for layer in FORBIDDEN}
    by_layer["core"].append(PACKAGE)
    for info in pkgutil.walk_packages(airflow_provider_rowfilter.__path__, prefix=f"{PACKAGE}."):
        top = info.name.split(".")[1]
        by_layer.setdefault(LAYER_OF.get(top, "unclassified"), []).append(info.name)
    return by_layer


def _import_blocked(modules: list[str], blocked: tuple[str, ...]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_WITH_BLOCKED, json.dumps(list(blocked)), json.dumps(modules)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_top_level_name_has_a_layer() -> None:
    unclassified = _modules().get("unclassified", [])
    assert unclassified == [], f"add these to LAYER_OF in {__file__}: {unclassified}"


def test_every_layered_name_exists() -> None:
    """LAYER_OF names only what the package holds (a stale name would hide a missing layer)."""
    present = {"__init__"} | {info.name for info in pkgutil.iter_modules(airflow_provider_rowfilter.__path__)}
    assert sorted(set(LAYER_OF) - present) == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_without_forbidden_packages(layer: str) -> None:
    modules = _modules()[layer]
    if not modules and layer not in REQUIRED_LAYERS:
        pytest.skip(f"no {layer} modules yet")
    result = _import_blocked(modules, FORBIDDEN[layer])
    assert result["failed"] == {}, "\n".join(f"{m}:\n{tb}" for m, tb in dict(result["failed"]).items())
    assert result["leaked"] == []
    assert sorted(result["imported"]) == sorted(modules)
    assert len(modules) >= 1


def test_blocker_catches_a_forbidden_submodule() -> None:
    """A dotted entry blocks that package only: the demo needs the tooling's local PostgreSQL."""
    module = f"{TOOLING}.demo.run"
    result = _import_blocked([module], (f"{TOOLING}.embedded",))
    assert result["imported"] == []
    assert f"import of '{TOOLING}.embedded' is blocked" in dict(result["failed"])[module]


def test_blocker_catches_a_forbidden_import() -> None:
    """The harness can fail: the spark layer does not import with pyspark blocked."""
    module = f"{PACKAGE}.spark.session"
    result = _import_blocked([module], ("pyspark",))
    assert result["imported"] == []
    assert "import of 'pyspark' is blocked" in dict(result["failed"])[module]


def test_the_snapshot_job_loads_without_spark_or_the_log() -> None:
    """A table read by one reader copies without Spark (jobs/snapshot.py _SparkOnDemand): the job's module
    loads without pyspark (its Connect client alone takes 0.7 s) and without pyarrow (the change log's)."""
    module = f"{PACKAGE}.jobs.snapshot"
    result = _import_blocked([module], ("pyspark", "pyarrow", "numpy"))
    assert result["failed"] == {} and result["imported"] == [module] and result["leaked"] == []


def test_the_apply_job_loads_without_spark_for_the_operator_s_idle_run() -> None:
    """ApplyChangesOperator runs jobs/apply.py in its task up to the first change to judge (skip_when_idle):
    the job's module and what it imports at load time must not need pyspark, which Airflow code never loads."""
    module = f"{PACKAGE}.jobs.apply"
    result = _import_blocked([module], ("pyspark",))
    assert result["failed"] == {} and result["imported"] == [module] and result["leaked"] == []
