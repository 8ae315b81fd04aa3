"""The jobs' environment on a cluster (issue 44, 5f): deploy/jobs/requirements.in, at the pins of constraints.txt, is
all that the jobs' driver and executors import, and the image (deploy/jobs/Dockerfile), the Kubernetes pod
template and the YARN archive recipe (docs/operators.md) are built from exactly that.

No image is built here (no registry to pull the bases from): what is checked is that every module the jobs run
(airflow_provider_rowfilter.jobs, .spark, .change_log, imported in a fresh interpreter) comes from a distribution
the requirements bring in, each pinned, and that none is Airflow.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "deploy" / "jobs" / "requirements.in"

#: Imported when installed, not needed: sqlglot.helper defines its own when the import fails. The jobs are imported
#: with these made unimportable, so the check proves the jobs run without them.
OPTIONAL = ("mypy_extensions",)
IMPORTED = """
import importlib, json, pkgutil, sys
before = set(sys.modules)
for optional in OPTIONAL:
    sys.modules[optional] = None
for name in ("jobs", "spark", "change_log"):
    package = importlib.import_module("airflow_provider_rowfilter." + name)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
from importlib.metadata import packages_distributions
owners = packages_distributions()
tops = {m.split(".")[0] for m, module in list(sys.modules.items()) if m not in before and module is not None}
print(json.dumps(sorted(owners[t] for t in tops if t in owners)))
"""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[_canonical(name)] = version.strip()
    return pins


def _closure(requirements: list[Requirement]) -> set[str]:
    """The distributions ``requirements`` install, by their installed metadata (markers and extras evaluated)."""
    found: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        requirement, extras = todo.pop()
        name = _canonical(requirement.name)
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in found:
            continue
        found.add(key)
        try:
            requires = distribution(requirement.name).requires or []
        except PackageNotFoundError:
            continue
        for text in requires:
            child = Requirement(text)
            environments = [{"extra": e} for e in extras] or [{"extra": ""}]
            if child.marker is None or any(child.marker.evaluate(env) for env in environments):
                todo.append((child, frozenset(child.extras)))
    return {k.split("[", 1)[0] for k in found}


def test_every_job_imports_with_the_pinned_job_requirements_alone() -> None:
    requirements, pins = _requirements(), _pins()
    assert {_canonical(r.name) for r in requirements} <= set(pins), "a job requirement constraints.txt does not pin"
    installs = _closure(requirements)
    assert installs <= set(pins), f"not pinned in constraints.txt: {sorted(installs - set(pins))}"
    done = subprocess.run([sys.executable, "-c", f"OPTIONAL = {OPTIONAL!r}\n{IMPORTED}"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    # Each module imported, by the distributions that hold it (pyspark's files are pyspark's and pyspark-client's).
    owners = [{_canonical(d) for d in names} - {"airflow-provider-rowfilter"}
              for names in json.loads(done.stdout.splitlines()[-1])]
    imported = set().union(*owners)
    assert {"pyspark", "pyarrow", "pydantic", "numpy", "psycopg", "sqlglot"} <= imported
    assert not any(d.startswith("apache-airflow") for d in imported), sorted(imported)
    missing = [sorted(names) for names in owners if names and not names & installs]
    assert not missing, f"imported by the jobs, not brought in by {REQUIREMENTS.name}: {missing}"


def test_the_image_the_pod_template_and_the_yarn_recipe_use_the_same_requirements() -> None:
    dockerfile = (REPO / "deploy" / "jobs" / "Dockerfile").read_text()
    assert "-c /tmp/rowfilter/constraints.txt -r /tmp/rowfilter/requirements.in" in dockerfile
    assert "--no-deps" in dockerfile and "USER 185" in dockerfile
    spark_version = re.search(r"ARG SPARK_VERSION=(\S+)", dockerfile)
    assert spark_version and spark_version.group(1) == _pins()["pyspark"], "the entrypoint's Spark is pyspark's"
    template = yaml.safe_load((REPO / "deploy" / "kubernetes" / "pod-template.yaml").read_text())
    [container] = template["spec"]["containers"]
    assert template["spec"]["securityContext"]["runAsNonRoot"] and container["image"].startswith("rowfilter-jobs")
    assert all("valueFrom" in e for e in container["env"]), "a secret in the template itself"
    operators = (REPO / "docs" / "operators.md").read_text()
    assert "pip install -c constraints.txt -r deploy/jobs/requirements.in" in operators
