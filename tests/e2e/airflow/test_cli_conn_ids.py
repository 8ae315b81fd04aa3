"""The rowfilter command reads a DAG factory spec file as it is: its Airflow connection ids resolved through
Airflow in a process of its own (hooks/spec_resolver.py), never by the command's own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.airflow.cluster import Cluster
from tests.airflow.support import REPO, conn_env
from tests.s3_server import REGION, S3Server


def rowfilter(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_provider_rowfilter.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_every_command_finds_connections_wherever_airflow_keeps_them(
        airflow_db: dict[str, str], cluster: Cluster, tmp_path: Path) -> None:
    """The publisher's connection imported with ``airflow connections import`` lives in the metastore only, where a plain
    process's task SDK does not look (issue 29 item 3); the subscriber's is an ``AIRFLOW_CONN_*`` variable. refresh,
    status and skip find both, and their SCRAM passwords work; a missing one is named, with where to make it."""
    env = {k: v for k, v in airflow_db.items() if not k.startswith("AIRFLOW_CONN_")}
    # As docs/first-week.md makes it: a file only its owner reads, imported, then removed; no password on a
    # command line (issue 46 item 4).
    private = tmp_path / "connections.json"
    private.touch(mode=0o600)
    private.write_text(json.dumps({"rf_meta_pub": {
        "conn_type": "postgres", "host": cluster.pg.host, "port": cluster.pg.port, "login": cluster.pub_role,
        "password": cluster.pub_password, "schema": cluster.pub_db}}))
    command = [sys.executable, "-m", "airflow", "connections", "import", str(private)]
    added = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert added.returncode == 0, added.stdout + added.stderr
    assert cluster.pub_password not in " ".join(command) + added.stdout + added.stderr
    private.unlink()
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
    assert "airflow connections import" in refused.stderr and conn_env("no_such_conn") in refused.stderr
    assert "--conn-password" not in refused.stderr  # the hint puts no password on a command line
    with psycopg.connect(cluster.pg.dsn(cluster.pub_db), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('rowfilter_meta')")


def test_the_change_logs_store_credentials_come_from_an_airflow_connection(
        airflow_db: dict[str, str], cluster: Cluster, s3: S3Server, tmp_path: Path) -> None:
    """A change log on S3 with no credentials in the command's environment: the spec's ``change_log_conn_id``, or
    ``--change-log-conn-id``, names an ``aws`` connection made with ``airflow connections add`` (the metadata
    database only), resolved as the spec's other connection ids are (hooks/spec_resolver.py); its secret never
    shows. Without it the run fails naming the store; a local log refuses a connection id."""
    env = {k: v for k, v in airflow_db.items() if not k.startswith(("AIRFLOW_CONN_", "AWS_"))}
    added = subprocess.run(
        [sys.executable, "-m", "airflow", "connections", "add", "rf_meta_store", "--conn-json", json.dumps(
            {"conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
             "extra": {"endpoint_url": s3.endpoint, "region_name": REGION}})],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    assert added.returncode == 0, added.stdout + added.stderr
    for role, login, password, db in (("pub", cluster.pub_role, cluster.pub_password, cluster.pub_db),
                                      ("sub", cluster.sub_role, cluster.sub_password, cluster.sub_db)):
        env[conn_env(f"rf_s3_{role}")] = json.dumps({"conn_type": "postgres", "host": cluster.pg.host,
                                                    "port": cluster.pg.port, "login": login, "password": password,
                                                    "schema": db})
    # the store's address in the environment (no secret), its keys in the connection only
    env = {**env, "PGPASSWORD": "", "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": REGION}
    bucket = s3.bucket()
    plain = ("subscription: metas3\npublisher_conn_id: rf_s3_pub\nsubscriber_conn_id: rf_s3_sub\npublications: [p1]\n"
             f"change_log: s3://{bucket}/subs/metas3\n")
    named = tmp_path / "named.yaml"
    named.write_text(plain + "change_log_conn_id: rf_meta_store\n")
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text(plain)
    try:
        for args in (["refresh", "--spec", str(named)], ["apply", "--spec", str(named), "--json"]):
            done = rowfilter(*args, env=env)
            assert done.returncode == 0, (args, done.stdout, done.stderr)
            assert s3.secret_key not in done.stdout + done.stderr
        written = s3.keys(bucket, "subs/metas3/")
        assert "subs/metas3/_position.json" in written and any(k.endswith(".parquet") for k in written), written

        refused = rowfilter("apply", "--spec", str(unnamed), "--json", env=env)
        assert refused.returncode == 1 and f"s3://{bucket}/subs/metas3" in refused.stderr, refused.stderr
        assert "change_log_conn_id" in refused.stderr, refused.stderr  # the hint names the way in
        done = rowfilter("apply", "--spec", str(unnamed), "--change-log-conn-id", "rf_meta_store", "--json", env=env)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert s3.secret_key not in done.stdout + done.stderr

        local = tmp_path / "local.yaml"
        local.write_text(plain.replace(f"s3://{bucket}/subs/metas3", str(tmp_path / "changes")))
        refused = rowfilter("status", "--spec", str(local), "--change-log-conn-id", "rf_meta_store", env=env)
        assert refused.returncode == 1
        assert "names change_log_conn_id 'rf_meta_store', but its change log" in refused.stderr, refused.stderr
    finally:
        with psycopg.connect(cluster.pg.dsn(cluster.pub_db), autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = 'rowfilter_metas3'")
