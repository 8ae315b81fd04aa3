"""Run code in a fresh interpreter whose meta path refuses chosen packages: what the layering tests use.

Shared by tests/test_layers.py (every module of a layer, imported with the packages it must not load
blocked) and tests/airflow/test_dag_parse.py (a DAG file parsed as the scheduler parses it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_BLOCKER = textwrap.dedent(
    """
    import importlib, json, runpy, sys, traceback
    from importlib.abc import MetaPathFinder

    blocked, modules, files = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])

    class Blocker(MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if any(fullname == b or fullname.startswith(b + ".") for b in blocked):
                raise ModuleNotFoundError(f"import of {fullname!r} is blocked in this layer", name=fullname)
            return None

    sys.meta_path.insert(0, Blocker())
    imported, failed, names = [], {}, {}
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:
            failed[module] = traceback.format_exc(limit=-6)
        else:
            imported.append(module)
    for path in files:
        try:
            names[path] = sorted(runpy.run_path(path, run_name="dag_file"))
        except Exception:
            failed[path] = traceback.format_exc(limit=-6)
        else:
            imported.append(path)
    leaked = sorted(n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in blocked))
    print(json.dumps({"imported": imported, "failed": failed, "leaked": leaked, "names": names}))
    """
)


def import_blocked(modules: list[str], blocked: tuple[str, ...], files: list[str] = ()) -> dict:
    """Import ``modules`` and run the Python ``files`` with ``blocked`` refused; what was imported, failed, leaked.

    ``names`` holds, per file, the global names its run left (a DAG file's DAGs).
    """
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKER, json.dumps(list(blocked)), json.dumps(modules), json.dumps(list(files))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
