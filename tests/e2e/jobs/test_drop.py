"""``rowfilter drop`` (DROP SUBSCRIPTION) against a real publisher and subscriber."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.change_log.log import POSITION_FILE, ChangeLog
from airflow_provider_rowfilter.cli import main
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply_lock
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.table_copy import table_lock
from airflow_provider_rowfilter.publisher.capture import capture
from airflow_provider_rowfilter.publisher.capture_objects import capture_publication_names
from airflow_provider_rowfilter.publisher.writer_lock import writer_lock_on

SUB = "drop_s1"
SLOT = f"rowfilter_{SUB}"
TABLES = """
CREATE TABLE t1 (a int PRIMARY KEY, b text);
CREATE TABLE t2 (id int PRIMARY KEY, v int);
"""
STATE_TABLES = ("subscription", "subscription_rel", "refresh_history", "batch_history")


@pytest.fixture
def dbs(fresh_db):
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(TABLES)
        conn.execute("CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5), t2")
    with psycopg.connect(sub, autocommit=True) as conn:
        conn.execute(TABLES)
        conn.execute("INSERT INTO t1 VALUES (6, 'kept'), (7, 'kept too')")
    return pub, sub


def spec_file(tmp_path: Path, pub: str, sub: str, name: str = SUB, file: str = "spec.yaml") -> Path:
    path = tmp_path / file
    # Judged in Spark: our capture publications exist, and dropping them is part of what is tested.
    path.write_text(yaml.safe_dump({"subscription": name, "publisher": pub, "subscriber": sub,
                                    "publications": ["p1"], "copy_data": False, "filtering": "spark"}))
    return path


def publisher_objects(pub: str, name: str = SUB) -> dict[str, bool]:
    with psycopg.connect(pub) as conn:
        slot = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                            (f"rowfilter_{name}",)).fetchone()[0]
        publication = conn.execute("SELECT count(*) FROM pg_publication WHERE pubname = ANY(%s)",
                                   (list(capture_publication_names(name).values()),)).fetchone()[0]
    return {"slot": slot == 1, "publication": publication > 0}


def state_rows(sub: str, name: str = SUB) -> dict[str, int]:
    with psycopg.connect(sub) as conn:
        return {table: conn.execute(f"SELECT count(*) FROM rowfilter.{table} WHERE "
                                    f"{'name' if table == 'subscription' else 'subscription'} = %s",
                                    (name,)).fetchone()[0] for table in STATE_TABLES}


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["drop", *args])
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), " ".join(err.split())


def test_drop_removes_slot_publication_state_and_sets_the_change_log_aside(dbs, tmp_path, capsys):
    pub, sub = dbs
    path = spec_file(tmp_path, pub, sub)
    spec = SubscriptionSpec.load(path)
    other = SubscriptionSpec.load(spec_file(tmp_path, pub, sub, name="drop_s2", file="other.yaml"))
    refresh(spec)
    refresh(other)
    # Nothing to apply yet (no Spark), but a batch in the history and a position in the log.
    assert main(["apply", "--spec", str(path), "--json"]) == 0
    batch = json.loads(capsys.readouterr().out)
    assert batch["batch_id"] is not None and batch["lag_bytes"] is not None
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t1 VALUES (10, 'x'); INSERT INTO t2 VALUES (1, 1)")
    assert capture(spec).segment is not None
    log_dir = spec.change_log_dir()
    logged = [s.path.name for s in ChangeLog(log_dir).segments()]  # with the first apply's heartbeat, if any
    assert logged
    assert publisher_objects(pub) == {"slot": True, "publication": True}
    assert state_rows(sub) == {"subscription": 1, "subscription_rel": 2, "refresh_history": 1, "batch_history": 1}

    code, out, err = run(capsys, "--spec", str(path))

    assert code == 0, err
    assert f"subscription {SUB}: dropped" in out
    assert f"- replication slot {SLOT} on the publisher (it retained" in out
    assert (f"- publication {SLOT}, {SLOT}_insert, {SLOT}_update, {SLOT}_delete, {SLOT}_truncate on the publisher"
            in out)  # every capture publication
    assert "2 tables (public.t1, public.t2), 1 refresh and 1 batch of history" in out
    assert publisher_objects(pub) == {"slot": False, "publication": False}
    assert state_rows(sub) == dict.fromkeys(STATE_TABLES, 0)
    # The subscriber's tables and their data stay; the other subscription is untouched.
    with psycopg.connect(sub) as conn:
        assert conn.execute("SELECT a, b FROM t1 ORDER BY a").fetchall() == [(6, "kept"), (7, "kept too")]
    assert publisher_objects(pub, "drop_s2") == {"slot": True, "publication": True}
    assert state_rows(sub, "drop_s2")["subscription_rel"] == 2
    with psycopg.connect(pub) as conn:
        assert conn.execute("SELECT count(*) FROM pg_publication WHERE pubname = 'p1'").fetchone()[0] == 1
    # The change log is set aside whole, never deleted.
    assert not log_dir.exists()
    (aside,) = log_dir.parent.glob(f"{log_dir.name}.dropped-*")
    assert f"change log moved to {aside}" in out
    assert [s.path.name for s in ChangeLog(aside).segments()] == logged and (aside / POSITION_FILE).exists()

    code, out, err = run(capsys, "--spec", str(path))
    assert (code, out, err) == (0, f"subscription {SUB}: nothing to drop", "")
    assert list(log_dir.parent.glob(f"{log_dir.name}*")) == [aside]

    assert main(["refresh", "--spec", str(path)]) == 0  # the name is free again: a new slot, every table new
    out = " ".join(capsys.readouterr().out.split())
    assert "+ public.t1 (r)" in out and "+ public.t2 (r)" in out
    assert f"created replication slot {SLOT} (pgoutput, failover) on the publisher" in out  # PostgreSQL 17+


def test_an_active_slot_is_not_dropped(dbs, tmp_path, capsys, local_pg):
    pub, sub = dbs
    path = spec_file(tmp_path, pub, sub)
    refresh(SubscriptionSpec.load(path))
    # A walsender streaming from the slot, as a subscriber's apply worker would: the slot is active.
    reader = subprocess.Popen(
        [str(local_pg.bin_dir / "pg_recvlogical"), "-d", pub, "-S", SLOT, "--start", "-f", os.devnull,
         "-o", "proto_version=1", "-o", f"publication_names={SLOT}", "--no-loop"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        pid = wait_for_active_pid(pub, reader)
        code, out, err = run(capsys, "--spec", str(path))
        assert code == 1 and out == ""
        assert f'replication slot "{SLOT}" is active for PID {pid}' in err
        assert "stop the subscription's DAG first" in err and "nothing was dropped" in err
        assert publisher_objects(pub) == {"slot": True, "publication": True}
        assert state_rows(sub)["subscription_rel"] == 2
    finally:
        reader.terminate()
        reader.wait(timeout=30)
    wait_for_active_pid(pub, None)
    code, out, err = run(capsys, "--spec", str(path))
    assert code == 0, err
    assert publisher_objects(pub) == {"slot": False, "publication": False}
    assert state_rows(sub)["subscription"] == 0


def wait_for_active_pid(pub: str, reader: subprocess.Popen | None) -> int | None:
    """The slot's active_pid once it is (reader given) or is no longer (reader None) in use."""
    deadline = time.monotonic() + 30
    with psycopg.connect(pub, autocommit=True) as conn:
        while True:
            pid = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                               (SLOT,)).fetchone()[0]
            if (pid is not None) == (reader is not None):
                return pid
            if reader is not None and reader.poll() is not None:
                pytest.fail(f"pg_recvlogical exited: {reader.stderr.read().decode()}")
            assert time.monotonic() < deadline, "the slot's active state did not change"
            time.sleep(0.05)


@pytest.mark.parametrize("job", ["apply", "snapshot", "capture"])
def test_a_running_job_of_the_subscription_is_not_interrupted(dbs, tmp_path, capsys, job):
    pub, sub = dbs
    path = spec_file(tmp_path, pub, sub)
    spec = SubscriptionSpec.load(path)
    refresh(spec)
    capture(spec)  # the change-log directory exists
    expected = {
        "apply": f"an apply of subscription '{SUB}' is running (PID",
        "snapshot": f"a snapshot or resync of subscription '{SUB}' is running (PID",
        "capture": f"a capture of subscription '{SUB}' is running (PID",
    }[job]
    # The very locks the jobs hold while they run.
    with psycopg.connect(sub, autocommit=True) as holder:
        holder_pid = holder.info.backend_pid
        if job == "apply":
            held = apply_lock(holder, SUB)
        elif job == "snapshot":
            held = table_lock(holder, SUB, TableName("public", "t1"))
        else:
            held = writer_lock_on(holder, SUB, "subscriber")
        with held:
            code, out, err = run(capsys, "--spec", str(path))
    assert code == 1 and out == ""
    assert expected in err and "stop the subscription's DAG first" in err
    assert f"PID {holder_pid} in the subscriber" in err
    assert publisher_objects(pub) == {"slot": True, "publication": True}
    assert state_rows(sub)["subscription_rel"] == 2
    assert spec.change_log_dir().is_dir()
    assert run(capsys, "--spec", str(path))[0] == 0  # the job ended: now it goes
    assert publisher_objects(pub) == {"slot": False, "publication": False}


def test_unreachable_publisher_then_keep_slot_then_drop_the_slot_later(dbs, tmp_path, capsys):
    pub, sub = dbs
    path = spec_file(tmp_path, pub, sub)
    refresh(SubscriptionSpec.load(path))
    unreachable = spec_file(tmp_path, "postgresql://postgres@127.0.0.1:1/nowhere", sub, file="down.yaml")

    code, out, err = run(capsys, "--spec", str(unreachable))
    assert code == 1 and out == ""
    assert f'could not connect to the publisher when attempting to drop replication slot "{SLOT}"' in err
    assert "rowfilter drop --keep-slot" in err and "slot_name = NONE" in err
    assert state_rows(sub)["subscription_rel"] == 2  # nothing dropped

    code, out, err = run(capsys, "--spec", str(unreachable), "--keep-slot")
    assert code == 0, err
    assert f"subscription {SUB}: dropped" in out and "2 tables" in out
    assert f"pg_drop_replication_slot('{SLOT}')" in out and "- replication slot" not in out
    assert state_rows(sub) == dict.fromkeys(STATE_TABLES, 0)
    assert publisher_objects(pub) == {"slot": True, "publication": True}

    code, out, err = run(capsys, "--spec", str(unreachable), "--keep-slot")
    assert code == 0 and out.startswith(f"subscription {SUB}: nothing to drop --keep-slot: the publisher was not")

    code, out, err = run(capsys, "--spec", str(path))  # the publisher is back
    assert code == 0, err
    assert f"- replication slot {SLOT} on the publisher" in out and f"- publication {SLOT}" in out
    assert "state in the subscriber" not in out
    assert publisher_objects(pub) == {"slot": False, "publication": False}
    assert run(capsys, "--spec", str(path))[1] == f"subscription {SUB}: nothing to drop"


def test_a_publication_of_our_name_that_we_did_not_create_is_left_alone(dbs, tmp_path, capsys):
    pub, sub = dbs
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(f"CREATE PUBLICATION {SLOT} FOR TABLE t1")
    code, out, err = run(capsys, "--spec", str(spec_file(tmp_path, pub, sub)))
    assert code == 0
    assert out == f"subscription {SUB}: nothing to drop"
    assert f'left alone: publication "{SLOT}" was not created by rowfilter' in err
    assert publisher_objects(pub) == {"slot": False, "publication": True}


# --- issue 46: a drop that could not finish changes nothing -------------------------------------------------
def test_a_change_log_that_cannot_be_listed_refuses_the_drop_before_anything(dbs, tmp_path, capsys, monkeypatch):
    pub, sub = dbs
    with socket_closed() as port:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nothing")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("ROWFILTER_STORE_TIMEOUT", "2")
        refresh(SubscriptionSpec.load(spec_file(tmp_path, pub, sub)))  # subscribed with its log in a folder
        path = tmp_path / "s3.yaml"  # then the spec names a store this process cannot reach
        path.write_text(yaml.safe_dump({"subscription": SUB, "publisher": pub, "subscriber": sub,
                                        "publications": ["p1"], "copy_data": False,
                                        "change_log": "s3://no-such-bucket/drop"}))
        code, out, err = run(capsys, "--spec", str(path))
    assert code == 1, (out, err)
    assert "could not list the change log 's3://no-such-bucket/drop'" in err
    assert "nothing was dropped: the drop moves the change log aside last, and checks first that it can" in err
    assert "nothing was advanced" not in err and "change_log_conn_id" in err
    assert publisher_objects(pub)["slot"] and state_rows(sub)["subscription"] == 1  # untouched


def test_origins_the_role_may_not_drop_refuse_the_drop_and_name_the_grant(dbs, tmp_path, capsys, monkeypatch):
    pub, sub = dbs
    path = spec_file(tmp_path, pub, sub)
    refresh(SubscriptionSpec.load(path))
    role = "drop_no_origin_functions"
    with psycopg.connect(sub, autocommit=True) as conn:
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        origin = f"rowfilter_{oid}_{SUB}"
        conn.execute(f"SELECT pg_replication_origin_create('{origin}')")  # as an apply with the GRANT left it
        conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'origin-less-7'")
        conn.execute(f"GRANT USAGE ON SCHEMA rowfilter TO {role}; GRANT SELECT ON ALL TABLES IN SCHEMA rowfilter "
                     f"TO {role}")
    try:
        info = psycopg.conninfo.conninfo_to_dict(sub)
        as_role = f"postgresql://{role}@{info['host']}:{info['port']}/{info['dbname']}"
        monkeypatch.setenv("ROWFILTER_SUBSCRIBER_PASSWORD", "origin-less-7")
        limited = tmp_path / "limited.yaml"
        limited.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "subscriber": as_role}))
        code, out, err = run(capsys, "--spec", str(limited))
        assert code == 1, (out, err)
        assert f"role {role} may not drop the replication origin(s) {origin} of subscription '{SUB}'" in err
        assert "nothing was dropped" in err and "GRANT EXECUTE ON FUNCTION pg_replication_origin_create(text), " \
            "pg_replication_origin_drop(text)" in err and f"SELECT pg_replication_origin_drop('{origin}')" in err
        assert publisher_objects(pub)["slot"] and state_rows(sub)["subscription"] == 1  # untouched
        # With the drop the superuser's (as the GRANT makes it the role's): origins go with the subscription.
        monkeypatch.delenv("ROWFILTER_SUBSCRIBER_PASSWORD")
        assert main(["drop", "--spec", str(path)]) == 0
        with psycopg.connect(sub) as conn:
            assert conn.execute("SELECT count(*) FROM pg_replication_origin WHERE roname = %s",
                                (origin,)).fetchone() == (0,)
    finally:
        with psycopg.connect(sub, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


class socket_closed:
    """A port of 127.0.0.1 that nothing listens on, for the block."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        return None
