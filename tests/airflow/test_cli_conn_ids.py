"""The rowfilter command reads a DAG factory spec file as it is: its Airflow connection ids resolved through
Airflow in a process of its own (hooks/spec_resolver.py), never by the command's own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg

from tests.airflow.cluster import Cluster
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


def test_every_command_finds_connections_kept_in_the_metadata_database(
        airflow_db: dict[str, str], cluster: Cluster, tmp_path: Path) -> None:
    """Connections made with ``airflow connections add`` live in the metastore only, where a plain process's
    task SDK does not look: refresh, status and skip find them, and their SCRAM passwords work."""
    env = {k: v for k, v in airflow_db.items() if not k.startswith("AIRFLOW_CONN_")}
    for conn_id, db, role, password in (("rf_meta_pub", cluster.pub_db, cluster.pub_role, cluster.pub_password),
                                        ("rf_meta_sub", cluster.sub_db, cluster.sub_role, cluster.sub_password)):
        added = subprocess.run(
            [sys.executable, "-m", "airflow", "connections", "add", conn_id, "--conn-json", json.dumps(
                {"conn_type": "postgres", "host": cluster.pg.host, "port": cluster.pg.port, "login": role,
                 "password": password, "schema": db})],
            env=env, capture_output=True, text=True, timeout=120, check=False)
        assert added.returncode == 0, added.stdout + added.stderr
    spec = tmp_path / "demo.yaml"
    spec.write_text("subscription: meta\npublisher_conn_id: rf_meta_pub\nsubscriber_conn_id: rf_meta_sub\n"
                    "publications: [p1]\nchange_log: " + str(tmp_path / "changes") + "\n")
    env = {**env, "PGPASSWORD": "", "HOME": str(tmp_path)}  # no other way in than the metastore's passwords
    outputs = {}
    for args in (["refresh"], ["status", "--format", "json"], ["skip", "--lsn", "FFF/0"]):
        done = rowfilter(*args, "--spec", str(spec), env=env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        for secret in (cluster.pub_password, cluster.sub_password):
            assert secret not in done.stdout + done.stderr
        outputs[args[0]] = done.stdout
    assert "refreshed" in outputs["refresh"] and "will be skipped by the next apply" in outputs["skip"]
    status = json.loads(outputs["status"])
    assert [t["table"] for t in status["tables"]] == ["public.t1"] and status["slot"]["exists"] is True
    with psycopg.connect(cluster.pg.dsn(cluster.pub_db), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('rowfilter_meta')")
