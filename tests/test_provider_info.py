"""The provider is registered with Airflow through its entry point and listed by the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import airflow_provider_rowfilter
from airflow_provider_rowfilter.get_provider_info import get_provider_info

DISTRIBUTION = "airflow-provider-rowfilter"


def test_entry_point_is_registered_for_the_distribution() -> None:
    found = [
        ep for ep in entry_points(group="apache_airflow_provider") if ep.dist and ep.dist.name == DISTRIBUTION
    ]
    assert [(ep.name, ep.value) for ep in found] == [
        ("provider_info", "airflow_provider_rowfilter.get_provider_info:get_provider_info")
    ]
    info = found[0].load()()
    assert info == get_provider_info()
    assert info["package-name"] == DISTRIBUTION
    assert info["versions"] == [airflow_provider_rowfilter.__version__]


def test_airflow_providers_list_shows_the_provider(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "list", "--output", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    providers = {p["package_name"]: p for p in json.loads(done.stdout)}
    assert DISTRIBUTION in providers, sorted(providers)
    assert providers[DISTRIBUTION]["version"] == airflow_provider_rowfilter.__version__
