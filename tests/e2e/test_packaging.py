"""The distribution a user installs (docs/getting-started.md): the sdist and the wheel build, pass
``twine check`` (what PyPI would refuse), and the wheel alone imports and registers as an Airflow provider.

The build is PEP 517's isolated one (``python -m build``: setuptools comes from the package index, as
for any user); the wheel goes into a scratch venv with ``--no-deps``, so nothing of this checkout or of
the test venv is on its path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import airflow_provider_rowfilter

REPO = Path(__file__).resolve().parents[2]
FIND_PROVIDER = """
import json
from importlib.metadata import entry_points
[ep] = entry_points(group="apache_airflow_provider")
info = ep.load()()
import airflow_provider_rowfilter as package
print(json.dumps({"entry_point": ep.value, "package": info["package-name"], "file": package.__file__,
                  "version": package.__version__}))
"""


def _run(*command: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> str:
    # Without PYTHONPATH (the tests run with this checkout on it): pip would take the checkout's metadata
    # for an installed distribution and install nothing.
    env = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def test_the_sdist_and_wheel_build_check_and_install(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", dist, REPO)
    version = airflow_provider_rowfilter.__version__
    # A platform wheel: it holds the capture's C decoder (setup.py), built by the C compiler found here.
    (wheel,) = dist.glob(f"airflow_provider_rowfilter-{version}-cp*-*.whl")
    sdist = dist / f"airflow_provider_rowfilter-{version}.tar.gz"
    assert sorted(p.name for p in dist.iterdir()) == sorted([sdist.name, wheel.name])
    assert "PASSED" in _run(sys.executable, "-m", "twine", "check", "--strict", sdist, wheel)

    # What the wheel holds: the jobs spark-submit runs, the demo's SQL, the typing marker; no tests.
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("jobs/apply.py", "jobs/snapshot.py", "jobs/refresh.py", "tooling/demo/publications.sql", "py.typed",
                    "plugins/replication.js"):
        assert f"airflow_provider_rowfilter/{shipped}" in names, shipped
    assert not [n for n in names if n.startswith("tests/")]
    assert [n for n in names if n.startswith("airflow_provider_rowfilter/publisher/_pgoutput_native.") and n.endswith(".so")]
    assert any(n.endswith("/jobs/apply.py") for n in tarfile.open(sdist).getnames())
    assert any(n.endswith("/publisher/_pgoutput_native.c") for n in tarfile.open(sdist).getnames())

    # Where no C compiler is, the sdist still installs: without the extension (the numpy decoder does the same).
    bare = tmp_path / "bare"
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", bare, sdist, env={**os.environ, "CC": "/bin/false"})
    (plain,) = bare.glob("*.whl")
    assert not [n for n in zipfile.ZipFile(plain).namelist() if n.endswith(".so")]

    scratch = tmp_path / "venv"
    venv.create(scratch, with_pip=True)
    python = scratch / "bin" / "python"
    _run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel)
    found = json.loads(_run(python, "-I", "-c", FIND_PROVIDER, cwd=tmp_path))
    assert found["entry_point"] == "airflow_provider_rowfilter.get_provider_info:get_provider_info"
    assert found["package"] == "airflow-provider-rowfilter" and found["version"] == version
    assert found["file"].startswith(str(scratch))  # the installed wheel, not this checkout
