"""Prove the layering, two ways.

1. **Which of the package's layers a module may import** (:data:`MAY_IMPORT`), read from every import
   statement of every module (at the top, inside a function, under ``TYPE_CHECKING``): a module imports
   its own layer and the layers below it, never one above or beside it. The io layer is split by side:
   the change log imports neither database side, the publisher's side never the subscriber's, the
   subscriber's never the publisher's; the use cases (``flow``, flows/) compose them; the Airflow layer
   never imports the jobs it submits, and the operators never the DAG factory that builds DAGs of them.
2. **Which third-party packages a layer loads** (:data:`BLOCKED`): each layer's modules are imported
   in a fresh interpreter that refuses the packages it must not load (core is pure Python, Airflow code
   loads neither pyspark nor numpy and pyarrow, which a scheduler parsing a DAG file would pay for,
   tests/airflow/test_dag_parse.py), and no layer imports the tooling.

3. **No two rooms import each other** (:func:`rooms`): a folder of the package (flows/'s and core/'s subfolders
   each a room of their own) imports another only if that one does not import it back, however far round.

Each layer's modules are found with pkgutil: new modules are covered without editing this file.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

import airflow_provider_rowfilter
from tests.blocked_imports import import_blocked

PACKAGE = airflow_provider_rowfilter.__name__
ROOT = Path(airflow_provider_rowfilter.__file__).parent

# Top-level names inside the package -> the layer they belong to. Every name must be listed:
# a new top-level module or subpackage fails test_every_top_level_name_has_a_layer until it is.
LAYER_OF = {
    "__init__": "core",
    "get_provider_info": "core",
    "core": "core",
    # Pure Python beside core/: how numbers read to people, and the named fault points of the fault tests.
    "humane": "core",
    "faults": "core",
    # psycopg, shared by both sides: connections, and a table's name as SQL.
    "connection": "io",
    "identifiers": "io",
    # How the console command prints a table and shows a long copy or drain (Rich only).
    "console": "console",
    # pyarrow, no PostgreSQL: the durable log between the capture and the apply.
    "change_log": "change_log",
    # psycopg: each database's side; the capture writes the change log.
    "publisher": "publisher",
    "subscriber": "subscriber",
    # PySpark (never Airflow); a few modules without pyspark (the JVM's settings, its class archive).
    "spark": "spark",
    # The use cases, each run in process (pyspark loaded only when a batch or a table needs Spark): the jobs,
    # the CLI and the operators' in-task runs call them.
    "flows": "flow",
    # Entry points: the jobs spark-submit runs, and the console command that runs them in process.
    "jobs": "entry",
    "cli": "entry",
    # Airflow's side of the boundary: hooks, operators, sensors, triggers; above them the DAG factory that builds
    # DAGs of the operators and the UI's page that shows the factory's DAGs.
    "hooks": "airflow",
    "operators": "airflow",
    "sensors": "airflow",
    "triggers": "airflow",
    "plugins": "factory",
    "dag_factory": "factory",
    # The local PostgreSQL, the native referee and the demo: they may use every layer, none uses them.
    "tooling": "tooling",
}
_BELOW_FLOW = {"core", "io", "change_log", "publisher", "subscriber", "spark"}
#: The package's layers each layer may import (its own included).
MAY_IMPORT = {
    "core": {"core"},
    "io": {"core", "io"},
    "console": {"core", "console"},
    "change_log": {"core", "change_log"},
    "publisher": {"core", "io", "change_log", "publisher"},
    "subscriber": {"core", "io", "change_log", "subscriber"},
    "spark": {"core", "io", "change_log", "publisher", "subscriber", "spark"},
    "flow": _BELOW_FLOW | {"flow"},
    "entry": _BELOW_FLOW | {"flow", "console", "entry"},
    "airflow": _BELOW_FLOW | {"flow", "airflow"},
    "factory": _BELOW_FLOW | {"flow", "airflow", "factory"},
    "tooling": set(LAYER_OF.values()),
}
TOOLING = f"{PACKAGE}.tooling"
#: Third-party packages a layer's modules must not load when imported.
BLOCKED = {
    "core": ("airflow", "pyspark", "psycopg", "pyarrow", "numpy", TOOLING),
    "io": ("airflow", "pyspark", "pyarrow", "numpy", TOOLING),
    "console": ("airflow", "pyspark", "psycopg", "pyarrow", "numpy", TOOLING),
    "change_log": ("airflow", "pyspark", "psycopg", TOOLING),
    "publisher": ("airflow", "pyspark", TOOLING),
    # The triggerer and every DAG file read state through the subscriber's side: it loads no Arrow.
    "subscriber": ("airflow", "pyspark", "pyarrow", "numpy", TOOLING),
    "spark": ("airflow", TOOLING),
    "flow": ("airflow", "pyspark", TOOLING),
    "entry": ("airflow", TOOLING),
    "airflow": ("pyspark", "pyarrow", "numpy", TOOLING),
    "factory": ("pyspark", "pyarrow", "numpy", TOOLING),
    "tooling": (),
}
# Layers that must hold at least one module today; the others are checked once they exist.
REQUIRED_LAYERS = set(BLOCKED)


def _modules() -> dict[str, list[str]]:
    """Return every module of the package, by layer."""
    by_layer: dict[str, list[str]] = {layer: [] for layer in BLOCKED}
    by_layer["core"].append(PACKAGE)
    for info in pkgutil.walk_packages(airflow_provider_rowfilter.__path__, prefix=f"{PACKAGE}."):
        top = info.name.split(".")[1]
        by_layer.setdefault(LAYER_OF.get(top, "unclassified"), []).append(info.name)
    return by_layer


def _layer(module: str) -> str | None:
    """The layer of a module of the package (``None``: not one of ours)."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] not in LAYER_OF):  # the root, or a name it defines
        return LAYER_OF["__init__"]
    return LAYER_OF.get(parts[1], "unclassified")


def forbidden(importer: str, imported: str) -> bool:
    """Whether module ``importer`` may not import ``imported`` (a module of ours, or anything else)."""
    own, theirs = _layer(importer), _layer(imported)
    return own is not None and theirs is not None and theirs not in MAY_IMPORT[own]


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """Every module an import statement of ``path`` names (line, module), wherever the statement is."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative (ruff bans them; resolved all the same)
                package = module.split(".")[: -node.level] if not path.name == "__init__.py" else module.split(".")
                base = ".".join([*package, *([base] if base else [])])
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def test_every_top_level_name_has_a_layer() -> None:
    unclassified = _modules().get("unclassified", [])
    assert unclassified == [], f"add these to LAYER_OF in {__file__}: {unclassified}"


def test_every_layered_name_exists() -> None:
    """LAYER_OF names only what the package holds (a stale name would hide a missing layer)."""
    present = {"__init__"} | {info.name for info in pkgutil.iter_modules(airflow_provider_rowfilter.__path__)}
    assert sorted(set(LAYER_OF) - present) == []


def test_no_module_imports_a_layer_above_or_beside_its_own() -> None:
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts)
        for line, imported in _imports(path, module):
            if forbidden(module, imported):
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: {_layer(module)} imports {imported} "
                             f"({_layer(imported)})")
    assert wrong == []


# The breaks issue 31 found, each of which the check above must refuse.
BREAKS = {
    "the change log imports the publisher": ("change_log.log", "publisher.pgoutput_columns"),
    "the publisher imports the subscriber": ("publisher.capture", "subscriber.state"),
    "the subscriber imports the publisher": ("subscriber.copy_target", "publisher.copy_source"),
    "an operator runs the apply job": ("operators.apply_changes", "jobs.apply"),
    "an operator runs the drop job": ("operators.subscription_ops", "jobs.drop"),
    "the apply imports a job": ("flows.apply.capture_ahead", "jobs.refresh"),
    "the core imports the subscriber": ("core.apply_plan", "subscriber.apply_stage"),
    # And those main brought while issue 31 was under way (verify/reconcile, sync-sequences).
    "the subscriber's compare target imports the publisher": ("subscriber.compare_target", "publisher.copy_source"),
    "the subscriber's reconcile imports the publisher": ("subscriber.reconcile_target", "publisher.copy_source"),
    "an operator runs the sync-sequences job": ("operators.subscription_ops", "jobs.sync_sequences"),
    # And those issue 43 found: a flow importing an entry point, the operators importing the DAG factory.
    "a flow imports an entry point": ("flows.verify.verify", "jobs.exit_status"),
    "an operator imports the DAG factory": ("operators.task_errors", "dag_factory.settings"),
}


@pytest.mark.parametrize(("importer", "imported"), BREAKS.values(), ids=BREAKS.keys())
def test_each_known_break_is_refused(importer: str, imported: str) -> None:
    assert forbidden(f"{PACKAGE}.{importer}", f"{PACKAGE}.{imported}")


@pytest.mark.parametrize("layer", sorted(BLOCKED))
def test_layer_imports_without_forbidden_packages(layer: str) -> None:
    modules = _modules()[layer]
    if not modules and layer not in REQUIRED_LAYERS:
        pytest.skip(f"no {layer} modules yet")
    result = import_blocked(modules, BLOCKED[layer])
    assert result["failed"] == {}, "\n".join(f"{m}:\n{tb}" for m, tb in dict(result["failed"]).items())
    assert result["leaked"] == []
    assert sorted(result["imported"]) == sorted(modules)
    assert len(modules) >= 1


def test_blocker_catches_a_forbidden_submodule() -> None:
    """A dotted entry blocks that package only: the demo needs the tooling's local PostgreSQL."""
    module = f"{TOOLING}.demo.run"
    result = import_blocked([module], (f"{TOOLING}.embedded",))
    assert result["imported"] == []
    assert f"import of '{TOOLING}.embedded' is blocked" in dict(result["failed"])[module]


def test_blocker_catches_a_forbidden_import() -> None:
    """The harness can fail: the spark layer does not import with pyspark blocked."""
    module = f"{PACKAGE}.spark.session"
    result = import_blocked([module], ("pyspark",))
    assert result["imported"] == []
    assert "import of 'pyspark' is blocked" in dict(result["failed"])[module]


def test_the_snapshot_job_loads_without_spark_or_the_log() -> None:
    """A table read by one reader copies without Spark (flows/spark_on_demand.py SparkOnDemand): the job's module
    loads without pyspark (its Connect client alone takes 0.7 s) and without pyarrow (the change log's)."""
    module = f"{PACKAGE}.jobs.snapshot"
    result = import_blocked([module], ("pyspark", "pyarrow", "numpy"))
    assert result["failed"] == {} and result["imported"] == [module] and result["leaked"] == []


def test_the_apply_loads_without_spark_for_the_operator_s_run_in_its_task() -> None:
    """ApplyChangesOperator runs flows/apply/drain.py in its task up to the first batch Spark must judge
    (skip_when_idle): what that imports must not need pyspark, which Airflow code never loads."""
    module = f"{PACKAGE}.flows.apply.drain"
    result = import_blocked([module], ("pyspark",))
    assert result["failed"] == {} and result["imported"] == [module] and result["leaked"] == []


def _module_of(path: Path) -> str:
    relative = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts)


def room(module: str) -> str | None:
    """The room of a module of the package: its top-level name; in flows/ and core/, each subfolder and each module
    (``flows.verify``, ``flows.refresh``, ``core.spec``, ``core.errors``)."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    parts = module.split(".")
    if len(parts) == 1 or parts[1] not in LAYER_OF:  # the root, or a name it defines
        return "__init__"
    if parts[1] in ("flows", "core") and len(parts) > 2 and (
            (ROOT / parts[1] / parts[2]).is_dir() or (ROOT / parts[1] / f"{parts[2]}.py").exists()):
        return ".".join(parts[1:3])
    return parts[1]


def rooms() -> dict[str, set[str]]:
    """Which rooms each room imports (not itself), read from every import statement."""
    imports: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_of(path)
        for _, imported in _imports(path, module):
            here, there = room(module), room(imported)
            if here is not None and there is not None and here != there:
                imports.setdefault(here, set()).add(there)
    return imports


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while True:
                other = stack.pop()
                part.append(other)
                if other == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_rooms_import_each_other() -> None:
    graph = rooms()
    assert "flows.apply" in graph and "core.spec" in graph["flows.apply"]  # the rooms are read
    assert circles(graph) == [], {node: sorted(graph[node]) for part in circles(graph) for node in part}


# The circles issue 43 broke, each of which the check above must find.
ROOM_CIRCLES = {
    "the factory and the operators": {"dag_factory": {"operators"}, "operators": {"dag_factory"}},
    "verify, refresh and reconcile": {"flows.verify": {"flows.refresh"}, "flows.refresh": {"flows.verify"}},
    "the publication model and the filters": {"core.publication": {"core.filters"}, "core.filters": {"core.publication"}},
}


@pytest.mark.parametrize("graph", ROOM_CIRCLES.values(), ids=ROOM_CIRCLES.keys())
def test_each_known_circle_is_found(graph: dict[str, set[str]]) -> None:
    assert circles(graph) == [sorted(graph)]
