"""The rowfilter command reads a DAG factory spec file as it is: its Airflow connection ids resolved through
Airflow in a process of its own (hooks/spec_resolver.py), never by the command's own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.airflow.conftest import REPO, StateDb, conn_env


def rowfilter(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_provider_rowfilter.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_status_and_skip_read_a_factory_spec_file_through_airflow_connections(
        state_db: StateDb, fresh_db: Callable[..., str], airflow_conn: Callable[..., str], tmp_path: Path) -> None:
    pub = airflow_conn(fresh_db(), "pub")
    spec = tmp_path / "s1.yaml"
    spec.write_text(f"subscription: s1\npublisher_conn_id: {pub}\nsubscriber_conn_id: {state_db.conn_id}\n"
                    "publications: [p1]\nairflow:\n  schedule: '@hourly'\n")
    env = dict(os.environ)
    status = rowfilter("status", "--spec", str(spec), "--format", "json", env=env)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["subscription"] == "s1" and [t["table"] for t in doc["tables"]] == ["public.t1", "public.t2", "sales.t3"]
    skipped = rowfilter("skip", "--spec", str(spec), "--lsn", "0/5", env=env)
    assert skipped.returncode == 0 and "will be skipped by the next apply" in skipped.stdout, skipped.stderr

    missing = spec.with_name("missing.yaml")
    missing.write_text(spec.read_text().replace(f"publisher_conn_id: {pub}", "publisher_conn_id: no_such_conn"))
    refused = rowfilter("status", "--spec", str(missing), env=env)
    assert refused.returncode == 1
    assert "publisher_conn_id='no_such_conn': no such Airflow connection" in refused.stderr, refused.stderr
    assert conn_env("no_such_conn") in refused.stderr  # the hint names where to create it
