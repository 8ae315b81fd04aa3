"""The jobs as Spark Connect clients (spec ``spark_remote``) of the run's one local Connect server.

The differential cases of test_apply_differential.py run again through Connect: refresh, the initial
copy (spark/copy_frames.py) and the apply batches, beside PostgreSQL's own subscription; and a job
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

import pytest

from airflow_provider_rowfilter.jobs.apply import apply
from tests.jobs.databases import names, run_ours
from tests.jobs.test_apply_differential import DOC_PUBLISHER, DOC_STEPS, DOC_TABLES, publish

JOB_TIMEOUT = 300


def connect_spec(dbs, publications, url):
    return replace(dbs.spec(publications, f"ours_{next(names)}"), spark_remote=url)


def test_update_transformation_example_through_connect(dbs, spark_connect_url):
    dbs.create(DOC_PUBLISHER, DOC_TABLES)
    native = dbs.subscribe_native(("p1",))
    spec = connect_spec(dbs, ("p1",), spark_connect_url)
    copied = run_ours(spec, None)  # the initial copy's tasks run on the server's executors
    assert [t.rows_copied for t in copied.tables] == [2]  # (6, NSW) and (9, NSW)
    for step in DOC_STEPS:
        publish(dbs.publisher, [step])
        result = apply(spec)
        native.wait_caught_up()
        dbs.assert_same(("t1",))
    assert result.states == {"public.t1": "r"}
    assert result.changes > 0


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


def test_a_job_process_through_connect_applies_without_a_jvm(dbs, spark_connect_url, tmp_path):
    """``python -m …jobs.apply --spec-json`` with spark_remote, as the operators run it: no JVM below it."""
    dbs.create(DOC_PUBLISHER, DOC_TABLES)
    native = dbs.subscribe_native(("p1",))
    spec = connect_spec(dbs, ("p1",), spark_connect_url)
    run_ours(spec, None)
    publish(dbs.publisher, DOC_STEPS)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_HOME")}
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
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["changes"] > 0
    native.wait_caught_up()
    dbs.assert_same(("t1",))


@pytest.mark.parametrize("conf, refused", [
    ({"spark.executor.memory": "2g"}, "spark.executor.memory"),
    ({"spark.sql.warehouse.dir": "/tmp/elsewhere"}, "spark.sql.warehouse.dir"),
])
def test_a_setting_the_server_owns_is_refused_naming_it(dbs, spark_connect_url, conf, refused):
    from airflow_provider_rowfilter.core.errors import SpecError
    from airflow_provider_rowfilter.spark.session import job_session

    spec = replace(connect_spec(dbs, ("p1",), spark_connect_url), spark_conf=conf)
    with pytest.raises(SpecError, match=f"spark_conf {refused}=.* cannot be set by a Spark Connect client") as e:
        with job_session(spec, "apply"):
            pass
    assert "rowfilter spark-server start --conf" in str(e.value)
