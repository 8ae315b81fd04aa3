"""The rowfilter command reads a DAG factory spec file as it is: its Airflow connection ids resolved through
Airflow in a process of its own (hooks/spec_resolver.py), never by the command's own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.airflow.cluster import Cluster
from tests.airflow.conftest import REPO, conn_env


def rowfilter(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_provider_rowfilter.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_every_command_finds_connections_wherever_airflow_keeps_them(
        airflow_db: dict[str, str], cluster: Cluster, tmp_path: Path) -> None:
    """The publisher's connection made with ``airflow connections add`` lives in the metastore only, where a plain
    process's task SDK does not look (issue 29 item 3); the subscriber's is an ``AIRFLOW_CONN_*`` variable. refresh,
    status and skip find both, and their SCRAM passwords work; a missing one is named, with where to make it."""
    env = {k: v for k, v in airflow_db.items() if not k.startswith("AIRFLOW_CONN_")}
    added = subprocess.run(
        [sys.executable, "-m", "airflow", "connections", "add", "rf_meta_pub", "--conn-json", json.dumps(
            {"conn_type": "postgres", "host": cluster.pg.host, "port": cluster.pg.port, "login": cluster.pub_role,
             "password": cluster.pub_password, "schema": cluster.pub_db})],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    assert added.returncode == 0, added.stdout + added.stderr
    env[conn_env("rf_env_sub")] = json.dumps({
        "conn_type": "postgres", "host": cluster.pg.host, "port": cluster.pg.port, "login": cluster.sub_role,
        "password": cluster.sub_password, "schema": cluster.sub_db})
    spec = tmp_path / "demo.yaml"
    spec.write_text("subscription: meta\npublisher_conn_id: rf_meta_pub\nsubscriber_conn_id: rf_env_sub\n"
                    "publications: [p1]\nchange_log: " + str(tmp_path / "changes") + "\nairflow:\n  schedule: '@hourly'\n")
    env = {**env, "PGPASSWORD": "", "HOME": str(tmp_path)}  # no other way in than the connections' passwords
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

    missing = spec.with_name("missing.yaml")
    missing.write_text(spec.read_text().replace("publisher_conn_id: rf_meta_pub", "publisher_conn_id: no_such_conn"))
    refused = rowfilter("status", "--spec", str(missing), env=env)
    assert refused.returncode == 1
    assert "publisher_conn_id='no_such_conn': no such Airflow connection" in refused.stderr, refused.stderr
    assert "airflow connections add no_such_conn" in refused.stderr and conn_env("no_such_conn") in refused.stderr
    with psycopg.connect(cluster.pg.dsn(cluster.pub_db), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('rowfilter_meta')")
