"""Run ``dag.test()`` of DAGs in a fresh interpreter with its own AIRFLOW_HOME and sqlite database.

The demo runs the example DAGs this way, and so do the DAG tests. A fresh interpreter because
Airflow reads its configuration (home, database, DAGs folder) once, at import; this module itself
never imports Airflow (the demo is on the Spark side of the layers), it starts ``python -c``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_rowfilter.core.private_files import private_directory

RESULT_PREFIX = "DAG-TEST-RESULT "
#: The example DAGs of a source checkout (the demo runs them as they are).
EXAMPLE_DAGS = Path(__file__).resolve().parents[3] / "dags"  # the checkout's dags/, beside the package


class DagRunError(RuntimeError):
    """``dag.test()`` could not run (an import error, a crash, a time-out); ``output`` holds what it printed."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


def airflow_home(home: Path, dags_folder: Path = EXAMPLE_DAGS, *, timeout: float = 300) -> dict[str, str]:
    """Make ``home`` an AIRFLOW_HOME with an sqlite metadata database (``airflow db migrate``).

    Returns the environment that selects it (this process's, without its ``AIRFLOW*`` variables).
    """
    private_directory(home)  # 0700 when made here: its database holds the connections' passwords
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__CORE__DAGS_FOLDER=str(dags_folder),
    )
    done = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=home,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise DagRunError(f"airflow db migrate failed (exit {done.returncode})", done.stdout + done.stderr)
    return env

SCRIPT = r"""
import json, os, sys, time
from airflow.dag_processing.dagbag import DagBag
from airflow.models.asset import AssetEvent
from airflow.models.pool import Pool
from airflow.models.renderedtifields import RenderedTaskInstanceFields
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

runs, prefix, options = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
for name, slots in options.get("pools", {}).items():
    Pool.create_or_update_pool(name, slots, "created by tooling/demo/dag_runner.py", False)
bag = DagBag()
if bag.import_errors:
    raise SystemExit(f"import errors: {bag.import_errors}")
for number, (dag_id, run_conf) in enumerate(runs):
    if number and options.get("barrier"):
        # Wait until the test has acted on the previous run's result (run_dags' `between`).
        go = os.path.join(options["barrier"], f"go-{number}")
        print(f"DAG-TEST-WAITING {go}", flush=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                raise SystemExit(f"nobody created {go}")
            time.sleep(0.1)
    dr = bag.dags[dag_id].test(run_conf=run_conf or None)
    with create_session() as session:
        events = [{"uri": e.uri, "task_id": e.source_task_id, "map_index": e.source_map_index, "extra": e.extra}
                  for e in session.query(AssetEvent).filter_by(source_dag_id=dag_id, source_run_id=dr.run_id)
                  .order_by(AssetEvent.id)]
        tasks, xcoms, rendered, durations = {}, {}, {}, {}
        for ti in dr.get_task_instances(session=session):
            key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
            tasks[key] = str(getattr(ti.state, "value", ti.state))
            durations[key] = ti.duration
            row = session.query(XComModel).filter_by(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                                                     map_index=ti.map_index, key="return_value").one_or_none()
            if row is not None:
                xcoms[key] = row.value
            fields = session.query(RenderedTaskInstanceFields).filter_by(
                dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=ti.map_index).one_or_none()
            if fields is not None:
                rendered[key] = fields.rendered_fields
    state = str(getattr(dr.state, "value", dr.state))
    print(prefix + json.dumps({"dag_id": dag_id, "state": state, "tasks": tasks, "xcoms": xcoms,
                               "rendered": rendered, "durations": durations, "asset_events": events}, default=str),
          flush=True)
"""


def run_dags(airflow_db: dict[str, str], runs: list[tuple[str, dict[str, Any] | None]], *,
             dags_folder: Path | None = None, env: dict[str, str] | None = None,
             on_line: Callable[[str], None] | None = None, timeout: float = 300,
             pools: dict[str, int] | None = None,
             between: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run ``dag.test()`` for each ``(dag_id, run_conf)`` in one interpreter, in order.

    Returns one ``{"dag_id", "state", "tasks": {task_id: state}, "xcoms": {task_id: value}, "rendered":
    {task_id: rendered template fields as stored}, "durations": {task_id: seconds the task ran},
    "asset_events": [{"uri", "task_id", "map_index", "extra"}]}`` per run; each also carries the whole
    ``output`` of the interpreter. Mapped task instances are keyed ``task_id[map_index]``. A failed DAG
    run is a result (its ``state`` says so); an interpreter that could not run them all raises
    :class:`DagRunError`.

    :param on_line: called with each line of output as it comes (to act on what a task logs).
    :param pools: Airflow pools (name -> slots) to create before the runs.
    :param between: called with each run's result before the next run starts (the next run waits).
    """
    full = {**airflow_db, **(env or {})}
    if dags_folder is not None:
        full["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    # spark-submit is installed beside the interpreter by pyspark.
    full["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), full.get("PATH", "")])
    lines: list[str] = []
    barrier = tempfile.mkdtemp(prefix="dag-runner-") if between is not None else None
    options = {"pools": pools or {}, "barrier": barrier}
    done = 0
    with subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(runs), RESULT_PREFIX, json.dumps(options)],
                          env=full, cwd=full["AIRFLOW_HOME"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        timer = threading.Timer(timeout, process.kill)
        timer.start()
        try:
            for line in process.stdout or ():
                lines.append(line)
                if on_line is not None:
                    on_line(line)
                if barrier is not None and line.startswith(RESULT_PREFIX):
                    done += 1
                    if done < len(runs):
                        between(json.loads(line[len(RESULT_PREFIX):]))
                        Path(barrier, f"go-{done}").touch()
        finally:
            timer.cancel()
            if barrier is not None:
                shutil.rmtree(barrier, ignore_errors=True)
        returncode = process.wait()
    output = "".join(lines)
    results = [json.loads(line[len(RESULT_PREFIX):]) for line in lines if line.startswith(RESULT_PREFIX)]
    if returncode != 0 or len(results) != len(runs):
        raise DagRunError(f"dag.test() failed (exit {returncode}, {len(results)} of {len(runs)} runs done):\n"
                          f"{output[-10000:]}", output)
    for result in results:
        result["output"] = output
    return results
