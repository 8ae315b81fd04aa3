"""The jobs as Spark Connect clients (spec ``spark_remote``) of the run's one local Connect server.

The differential cases of test_apply_differential.py run again through Connect: refresh, the initial
copy (spark/copy_frames.py) and the apply batches, beside PostgreSQL's own subscription (the first with its
change log on the run's S3-compatible server); and a job
run as Airflow runs it (a process of its own) attaches to the server without starting a JVM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from airflow_provider_rowfilter.flows.refresh import refresh
from tests.e2e.jobs.apply_scenario import publish
from tests.e2e.jobs.databases import names
from tests.e2e.jobs.differential_cases import CASES, DOC_PUBLISHER, DOC_STEPS, DOC_TABLES
from tests.e2e.jobs.snapshot_scenario import SPLIT_SNAPSHOT, T1_SECOND_PAGE
from tests.roles import SUBSCRIBER

JOB_TIMEOUT = 300
SCRAM_PASSWORD = SUBSCRIBER.password


@pytest.fixture
def scram_role(password_roles):
    """The run's subscriber password role (tests/roles.py): a superuser that must authenticate with SCRAM."""
    return password_roles["subscriber"].name


def connect_spec(dbs, publications, url):
    # Judged by Spark: a batch the publisher judged is reduced in the job's process and never reaches the server.
    return replace(dbs.spec(publications, f"ours_{next(names)}", "spark"), spark_remote=url)


def job_env(**extra: str) -> dict[str, str]:
    # pyspark runs one mode per process, so every Connect client here is a process of its own (as the
    # operators run them), and none inherits the markers of a Connect session (spark/session.py).
    drop = ("PYSPARK_PYTHON", "SPARK_HOME", "PGPASSWORD", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def run_job(job: str, spec, cwd: Path, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-m", f"airflow_provider_rowfilter.jobs.{job}", "--spec-json",
                           spec.to_json()], env=job_env(**env), cwd=cwd, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ours_through_connect(spec, cwd: Path) -> dict:
    refresh(spec)  # no Spark
    return run_job("snapshot", spec, cwd)


def test_update_transformation_example_through_connect(dbs, spark_connect_url, s3_log, tmp_path):
    """... with the change log in the run's S3-compatible server (issue 44, 5c): the server has no hadoop-aws and no
    AWS_* of its own (spark/connect_server.py keeps none), so its executors read the segments with pyarrow, the
    client's credentials inside the task (spark/log_reader.py)."""
    dbs.create(DOC_PUBLISHER, DOC_TABLES)
    native = dbs.subscribe_native(("p1",))
    spec = replace(connect_spec(dbs, ("p1",), spark_connect_url), change_log=s3_log)
    copied = run_ours_through_connect(spec, tmp_path)  # the copy's tasks run on the server's executors
    assert [t["rows_copied"] for t in copied["tables"]] == [2], copied  # (6, NSW) and (9, NSW)
    for step in DOC_STEPS:
        publish(dbs.publisher, [step])
        result = run_job("apply", spec, tmp_path)
        native.wait_caught_up()
        dbs.assert_same(("t1",))
    assert result["states"] == {"public.t1": "r"}, result


# Representative cases of test_apply_differential.py: OR-ed filters across publish lists, a column list.
THROUGH_CONNECT = ("combination-publish-lists", "column-list")


@pytest.mark.parametrize("name", THROUGH_CONNECT)
def test_apply_through_connect_matches_native_logical_replication(dbs, spark_connect_url, tmp_path, name):
    publisher, subscriber, publications, tables, batches = CASES[name]
    dbs.create(publisher, subscriber)
    native = dbs.subscribe_native(publications)
    spec = connect_spec(dbs, publications, spark_connect_url)
    run_ours_through_connect(spec, tmp_path)
    for batch in batches:
        publish(dbs.publisher, batch)
        run_job("apply", spec, tmp_path)
        native.wait_caught_up()
        dbs.assert_same(tables)


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    names_: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        names_[int(entry.name)] = name
        children.setdefault(int(rest[1]), []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append((child, names_.get(child, "?")))
        todo.extend(children.get(child, []))
    return found


def test_a_job_process_through_connect_applies_without_a_jvm(dbs, spark_connect_url, scram_role, tmp_path):
    """``python -m …jobs.apply --spec-json`` with spark_remote, as the operators run it: no JVM below it.

    The subscriber's role authenticates with scram and its password is only in the job's environment:
    the server's executors, which write the stage, get it inside their task.
    """
    dbs.create(DOC_PUBLISHER, DOC_TABLES)
    native = dbs.subscribe_native(("p1",))
    spec = connect_spec(dbs, ("p1",), spark_connect_url)
    run_ours_through_connect(spec, tmp_path)
    info = psycopg.conninfo.conninfo_to_dict(dbs.ours)
    subscriber = f"postgresql://{scram_role}@{info['host']}:{info['port']}/{info['dbname']}"
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(subscriber).close()
    spec = replace(spec, subscriber=subscriber)
    publish(dbs.publisher, DOC_STEPS)
    env = job_env(ROWFILTER_SUBSCRIBER_PASSWORD=SCRAM_PASSWORD)
    process = subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_rowfilter.jobs.apply", "--spec-json", spec.to_json()],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[str] = set()
    deadline = time.monotonic() + JOB_TIMEOUT
    while process.poll() is None:
        seen.update(name for _, name in _descendants(process.pid))
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.02)
    out, err = process.communicate()
    assert process.returncode == 0, err[-4000:]
    assert "java" not in seen, seen
    assert SCRAM_PASSWORD not in out + err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["changes"] > 0
    native.wait_caught_up()
    dbs.assert_same(("t1",))


@pytest.mark.parametrize("conf, refused", [
    ({"spark.executor.memory": "2g"}, "spark.executor.memory"),
    ({"spark.sql.warehouse.dir": "/tmp/elsewhere"}, "spark.sql.warehouse.dir"),
])
def test_a_setting_the_server_owns_is_refused_naming_it(dbs, spark_connect_url, tmp_path, conf, refused):
    dbs.create(DOC_PUBLISHER + T1_SECOND_PAGE + ";", DOC_TABLES)
    spec = replace(connect_spec(dbs, ("p1",), spark_connect_url), spark_conf=conf)
    refresh(spec)
    # Two readers: a copy that needs Spark (one reader copies without it, and never sets spark_conf)
    done = subprocess.run([sys.executable, "-c", SPLIT_SNAPSHOT, spec.to_json()], env=job_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"ERROR: spark_conf {refused}=" in done.stderr and "cannot be set by a Spark Connect client" in done.stderr
    assert "rowfilter spark-server start --conf" in done.stderr
    with psycopg.connect(dbs.ours) as conn:  # nothing copied, the table still waits in i
        assert conn.execute("SELECT count(*) FROM t1").fetchone() == (0,)
        assert conn.execute("SELECT state FROM rowfilter.subscription_rel").fetchall() == [("i",)]


def test_a_classic_session_in_the_process_is_not_mixed_with_connect(dbs, spark, spark_connect_url):
    from airflow_provider_rowfilter.core.errors import SpecError
    from airflow_provider_rowfilter.spark.session import job_session

    spec = connect_spec(dbs, ("p1",), spark_connect_url)
    with pytest.raises(SpecError, match="already runs a classic Spark session") as e:
        with job_session(spec, "apply"):
            pass
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    assert "python -m airflow_provider_rowfilter.jobs" in str(e.value)


# A job's session as a process of its own sees it: which server-side session it attached to, and which Python
# workers the server ran its Arrow function in.
ATTACH = """
import json, sys
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.spark.session import job_session

def pids(batches):
    import os
    import pyarrow as pa
    for _ in batches:
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]})

subscription, remote, job, setting = sys.argv[1:5]
spec = SubscriptionSpec(subscription=subscription, publications=("p1",), spark_remote=remote,
                        spark_conf={"spark.sql.shuffle.partitions": setting})
with job_session(spec, job) as spark:
    workers = sorted({row.pid for row in spark.range(0, 1, 1, 1).mapInArrow(pids, "pid long").collect()})
    print(json.dumps({"session": spark.session_id, "workers": workers}))
"""


def _attach(remote: str, subscription: str = "s_reuse", job: str = "snapshot", setting: str = "2") -> dict:
    done = subprocess.run([sys.executable, "-c", ATTACH, subscription, remote, job, setting], env=job_env(),
                          capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_runs_of_a_job_attach_to_one_server_session_and_its_python_workers(spark_connect_url):
    """A new session costs the server new Python workers (a copy's writers, a large batch's); the runs of one job
    of one subscription attach to one session (spark/session.py reused_session_id), and leave it open."""
    first, second = _attach(spark_connect_url), _attach(spark_connect_url)
    assert second == first  # the same session, and the same worker process served both runs
    others = [_attach(spark_connect_url, job="apply"), _attach(spark_connect_url, subscription="s_other"),
              _attach(spark_connect_url, setting="3")]  # a session keeps its settings: other settings, another one
    assert len({first["session"], *(o["session"] for o in others)}) == 4
    assert all(o["workers"] != first["workers"] for o in others)


def test_a_session_the_server_closed_is_replaced(spark_connect_url):
    """The server refuses for good the id of a session it closed (released, or idle past its timeout): the run
    takes a new session instead of failing."""
    first = _attach(spark_connect_url, subscription="s_closed")
    release = ("import sys\nfrom pyspark.sql import SparkSession\n"
               "SparkSession.builder.remote(sys.argv[1] + '/;session_id=' + sys.argv[2]).create().stop()\n")
    subprocess.run([sys.executable, "-c", release, spark_connect_url, first["session"]], env=job_env(), check=True,
                   capture_output=True, timeout=JOB_TIMEOUT)
    after = _attach(spark_connect_url, subscription="s_closed")
    assert after["session"] != first["session"]


SETTINGS = """
import json, sys
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.spark.session import job_session

remote, leave = sys.argv[1:3]
spec = SubscriptionSpec(subscription="s_settings", publications=("p1",), spark_remote=remote,
                        spark_conf={"spark.sql.shuffle.partitions": "2"})
with job_session(spec, "apply") as spark:
    seen = {k: spark.conf.get(k) for k in ("spark.sql.adaptive.enabled", "spark.sql.shuffle.partitions")}
    if leave == "yes":  # what a run killed during a small batch's action leaves on its session
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        spark.conf.set("spark.sql.shuffle.partitions", "1")
    print(json.dumps({"session": spark.session_id, **seen}))
"""


def test_a_small_batchs_settings_left_on_a_reused_session_are_reset_by_the_next_run(spark_connect_url):
    """The next run on the job's session gets Spark's default AQE and its spec's shuffle partitions back,
    whatever a killed run left set (spark/settings.py SMALL_BATCH_SQL_SETTINGS)."""
    def run(leave: str) -> dict:
        done = subprocess.run([sys.executable, "-c", SETTINGS, spark_connect_url, leave], env=job_env(),
                              capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = run("yes"), run("no")
    assert second["session"] == first["session"]
    assert second["spark.sql.adaptive.enabled"] == "true" and second["spark.sql.shuffle.partitions"] == "2"
